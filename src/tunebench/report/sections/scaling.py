"""Scaling: speedup and efficiency of each scaling series, against ideal."""

from __future__ import annotations

from tunebench.document import Figure, Section, Table
from tunebench.format import fmt, pct
from tunebench.report import plots
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    scaled = [r for r in ctx.ok if r.metrics.scaling]
    if not scaled:
        return None
    t = Table(["configuration", "GPUs", "tokens/s", "per GPU", "speedup", "efficiency"])
    for r in scaled:
        m = r.metrics
        t.add(ctx.label(r), str(m.world_size), fmt(m.tokens_per_s), fmt(m.tokens_per_s_per_gpu),
              f"{m.scaling.speedup:.2f}x", pct(m.scaling.efficiency))
    s = Section("Scaling", [t, "Scaling efficiency = tokens/s(N) ÷ (N × tokens/s(1)), same per-GPU configuration."])
    if (p := plots.scaling(scaled, ctx.out)):
        s.add(Figure(p))
    return s
