"""Training performance: every run (failures included, with their error), the throughput plot, repeat noise."""

from __future__ import annotations

import statistics

from tunebench.document import Figure, Section, Table
from tunebench.format import error_cell, fmt, p50_ms, pct
from tunebench.report import plots
from tunebench.report.context import CV_LIMIT, ReportContext
from tunebench.units import GIB


def section(ctx: ReportContext) -> Section | None:
    if not ctx.train:
        return None
    t = Table(["configuration", "status", "tokens/s", "per GPU", "samples/s", "step p50 ms", "peak alloc GiB", "MFU",
               "error"])
    for r in ctx.train:
        m = r.metrics
        t.add(ctx.label(r), r.status, fmt(m.tokens_per_s), fmt(m.tokens_per_s_per_gpu), fmt(m.samples_per_s, ",.3f"),
              p50_ms(m.step_time_s), fmt(m.peak_mem_allocated_bytes, ".2f", GIB), pct(m.mfu), error_cell(r))
    s = Section("Training performance", [t])
    if (p := plots.throughput(ctx.ok, ctx.out, ctx.names)):
        s.add(Figure(p))
    cvs = [(ctx.names.get(h, ctx.label(rs[0])), statistics.stdev(t) / statistics.fmean(t))
           for h, rs in ctx.groups.items() if len(t := [r.metrics.tokens_per_s for r in rs if r in ctx.ok]) > 1]
    if cvs:
        s.add("Repeats: " + "; ".join(f"{n} CV {cv:.1%}" + (" (above 2%: noisy)" if cv > CV_LIMIT else "")
                                      for n, cv in cvs) + ".")
    return s
