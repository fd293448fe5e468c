"""Diagnostic analysis: each configuration against the baseline, sorted into what worked, what had no
measurable effect (within ±5%) and what did not."""

from __future__ import annotations

import statistics

from tunebench.document import Figure, Section, Table
from tunebench.report import plots
from tunebench.report.context import ReportContext


def _samples_per_s(ctx: ReportContext, rs: list) -> float:
    return statistics.fmean(r.metrics.samples_per_s for r in rs if r in ctx.ok)


def section(ctx: ReportContext) -> Section | None:
    if not ctx.baseline or len(ctx.groups) < 2:
        return None
    b_mem = ctx.baseline[0].metrics.peak_mem_allocated_bytes
    t = Table(["lever", "status", "tokens/s", "samples/s", "peak memory", "noise"])
    worked, flat, broke, effects = [], [], [], []
    for rs, eff, noise in ctx.effects():
        name = ctx.lever(rs)
        if eff is None:
            broke.append(f"{name}: {', '.join(sorted({r.status for r in rs}))}")
            t.add(name, rs[0].status, "-", "-", "-", "-")
            continue
        mem = rs[0].metrics.peak_mem_allocated_bytes
        dmem = None if not (mem and b_mem) else mem / b_mem - 1
        sps = _samples_per_s(ctx, rs) / _samples_per_s(ctx, ctx.baseline) - 1
        effects.append((name, eff))
        t.add(name, "ok", f"{eff:+.1%}", f"{sps:+.1%}", "-" if dmem is None else f"{dmem:+.1%}", f"±{noise:.0%}")
        (worked if eff > noise else flat if eff >= -noise else broke).append(
            f"{name}: tokens/s {eff:+.1%}, samples/s {sps:+.1%}"
            + ("" if dmem is None else f", peak memory {dmem:+.1%}"))
    s = Section("Diagnostic analysis", [f"Baseline: {ctx.label(ctx.baseline[0])}.", t])
    for head, items in (("What worked (faster beyond the noise)", worked),
                        ("No measurable effect (within the noise: twice the measured spread of runs and steps)", flat),
                        ("What did not work (slower, or failed)", broke)):
        if items:
            s.add(f"**{head}:** " + "; ".join(items) + ".")
    if (p := plots.levers(effects, ctx.out)):
        s.add(Figure(p))
    return s
