"""Recommendations: sentences computed from the rows; none is written when its data is missing."""

from __future__ import annotations

from tunebench.document import Section
from tunebench.format import fmt, gib
from tunebench.report.context import ReportContext

ADVICE = {"oom": "it does not fit this GPU; lower the batch or enable grad_ckpt.",
          "timeout": "it did not finish within its time limit.",
          "failed": "see its error in the store (tunebench results show).",
          "nan": "the loss diverged; lower the learning rate."}


def section(ctx: ReportContext) -> Section | None:
    if not ctx.train:
        return None
    out = []
    if ctx.ok:
        best = max(ctx.ok, key=lambda r: r.metrics.tokens_per_s)
        line = f"For throughput, use {ctx.label(best)} ({fmt(best.metrics.tokens_per_s)} tokens/s"
        if best.metrics.peak_mem_allocated_bytes:
            line += f", {gib(best.metrics.peak_mem_allocated_bytes)} peak"
        out.append(line + ").")
    if ctx.baseline and len(ctx.groups) > 1:
        for rs, eff, noise in ctx.effects():
            if eff is not None and abs(eff) > noise:  # within the measured noise it is no finding
                out.append(f"{ctx.lever(rs)}: {'gains' if eff > 0 else 'loses'} {abs(eff):.0%} tokens/s against the "
                           "baseline.")
    out += [f"{ctx.label(r)} ended with status {r.status}: {ADVICE[r.status]}" for r in ctx.train if r.status in ADVICE]
    for r in ctx.ok:
        if r.metrics.scaling and r.metrics.world_size > 1:
            e = r.metrics.scaling.efficiency
            out.append(f"{r.config.get('strategy')} at {r.metrics.world_size} GPUs keeps {e:.0%} scaling efficiency"
                       + (" (at least 90%: scale out freely)." if e >= 0.9
                          else " (below 90%: communication costs show)."))
    priced = [r for r in ctx.ok if ctx.costs.get(r.id)]
    if len(priced) > 1:
        c = min(priced, key=lambda r: ctx.costs[r.id].per_1m_tokens)
        out.append(f"For cost, {ctx.label(c)} is cheapest per token (${ctx.costs[c.id].per_1m_tokens:.3f} per 1M "
                   f"tokens on {ctx.costs[c.id].offering.provider}).")
    return Section("Recommendations", out or ["No successful run in this selection: nothing to recommend."])
