"""Hardware: each `tunebench hw` result's matmul, bandwidth and collective tables, and the busbw plot."""

from __future__ import annotations

from tunebench.document import Figure, Section
from tunebench.report import plots
from tunebench.report.bench import hw_tables
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    hw = ctx.kind("hw")
    if not hw:
        return None
    s = Section("Hardware")
    for i, r in enumerate(hw):
        s.add(f"`tunebench hw` on {r.metrics.device_name} ({r.created_at[:10]}, status {r.status}"
              + (", quick" if r.config.get("quick") else "") + ").")
        s.add(*hw_tables(r))
        if (p := plots.busbw(r, ctx.out, i)):
            s.add(Figure(p))
    s.add("MAMF: the highest per-shape mean TFLOP/s of a matmul sweep (stas00's mamf-finder method). Copy bandwidth "
          "counts read + write. busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and reduce-scatter "
          "(nccl-tests).")
    return s
