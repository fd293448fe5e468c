"""Inference: generation throughput and latency per precision and batch size, and the best of each."""

from __future__ import annotations

from tunebench.document import Figure, Section
from tunebench.format import fmt
from tunebench.report import plots
from tunebench.report.bench import infer_table
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    infer = ctx.kind("infer")
    if not infer:
        return None
    t = infer_table(infer)
    s = Section("Inference", [t.title + "."])
    t.title = ""
    s.add(t)
    ok = [r for r in infer if r.status == "ok"]
    if (p := plots.infer_batches(ok, ctx.out)):
        s.add(Figure(p))
    if ok:
        best = max(ok, key=lambda r: r.metrics.tokens_per_s)
        fast = min(ok, key=lambda r: r.metrics.ttft_s)
        s.add(f"Highest throughput: {best.config['model']} {best.config['precision']} at batch "
              f"{best.config['batch_size']}, {fmt(best.metrics.tokens_per_s)} tokens/s. Shortest time to first token: "
              f"{fast.config['precision']} at batch {fast.config['batch_size']}, {fast.metrics.ttft_s * 1e3:,.1f} ms.")
    return s
