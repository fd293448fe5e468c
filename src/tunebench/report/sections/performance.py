"""Training performance: every run (failures included, with their error), the throughput plot, repeat noise."""

from __future__ import annotations

from tunebench.document import Figure, Section, Table
from tunebench.format import error_cell, fmt, p50_ms, pct, peak_memory
from tunebench.report import plots
from tunebench.report.context import CV_LIMIT, ReportContext, cv


def section(ctx: ReportContext) -> Section | None:
    if not ctx.train:
        return None
    t = Table(["configuration", "status", "tokens/s", "per device", "samples/s", "step p50 ms", "peak memory", "MFU",
               "error"])
    for r in ctx.train:
        m = r.metrics
        t.add(ctx.label(r), r.status, fmt(m.tokens_per_s), fmt(m.tokens_per_s_per_gpu), fmt(m.samples_per_s, ",.3f"),
              p50_ms(m.step_time_s), peak_memory(m), pct(m.mfu), error_cell(r))
    s = Section("Training performance", [t])
    if (p := plots.throughput(ctx.ok, ctx.out, ctx.names)):
        s.add(Figure(p))
    spreads = [(ctx.label(rs[0]), t, cv(rs)) for rs in ctx.groups.values()
               if len(t := [r.metrics.tokens_per_s for r in rs if r in ctx.ok]) > 1]
    if spreads:
        s.add("Repeats (same configuration and environment): " + "; ".join(
            f"{n}: {len(t)} runs, {fmt(min(t))} to {fmt(max(t))} tokens/s, CV {c:.1%}"
            + (" (above 2%: noisy)" if c > CV_LIMIT else "") for n, t, c in spreads) + ".")
    return s
