"""Executive summary: how many runs ended how, and the best configuration for throughput, memory and cost."""

from __future__ import annotations

from tunebench.document import Section
from tunebench.format import fmt, gib, per_device
from tunebench.report.context import ReportContext, mean_tps

STATUSES = ("ok", "oom", "failed", "nan", "timeout")


def section(ctx: ReportContext) -> Section | None:
    if not ctx.train:
        return None
    s = Section("Executive summary")
    counts = {st: sum(r.status == st for r in ctx.train) for st in STATUSES}
    s.add(f"{len(ctx.train)} runs of {ctx.configs} configurations: "
          + ", ".join(f"{n} {st}" for st, n in counts.items() if n) + ".")
    if not ctx.ok:
        return s
    best = max(ctx.ok, key=lambda r: r.metrics.tokens_per_s)
    s.add(f"Highest throughput: **{ctx.label(best)}** at {fmt(best.metrics.tokens_per_s)} tokens/s "
          f"({fmt(best.metrics.tokens_per_s_per_gpu)} per {per_device(best)} on {best.metrics.world_size}).")
    with_mem = [r for r in ctx.ok if r.metrics.peak_mem_allocated_bytes]
    if with_mem:
        low = min(with_mem, key=lambda r: r.metrics.peak_mem_allocated_bytes)
        s.add(f"Lowest peak memory: **{ctx.label(low)}** at {gib(low.metrics.peak_mem_allocated_bytes)} allocated.")
    priced = [r for r in ctx.ok if ctx.costs[r.id]]
    if priced:
        c = min(priced, key=lambda r: ctx.costs[r.id].per_1m_tokens)
        k = ctx.costs[c.id]
        s.add(f"Lowest cost per token: **{ctx.label(c)}** at ${k.per_1m_tokens:.3f} per 1M tokens on "
              f"{k.offering.provider} (on-demand ${k.offering.on_demand}/GPU-h).")
    if ctx.baseline and len(ctx.groups) > 1:
        b_tps = mean_tps(ctx.baseline)
        s.add(f"Against the baseline ({ctx.label(ctx.baseline[0])}, {fmt(b_tps)} tokens/s) the best configuration "
              f"is {best.metrics.tokens_per_s / b_tps:.2f}x faster per token.")
    return s
