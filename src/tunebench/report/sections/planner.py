"""The planner against the runs: predicted and measured peak memory and throughput, with the error of each."""

from __future__ import annotations

from statistics import median

from tunebench.document import Section, Table
from tunebench.format import fmt, gib, pct
from tunebench.report.context import ReportContext

MEMORY_GOAL, SPEED_GOAL = 0.05, 0.15


def section(ctx: ReportContext) -> Section | None:
    rows = [r for r in ctx.ok if r.metrics.predicted and r.metrics.peak_mem_allocated_bytes and r.metrics.tokens_per_s]
    if not rows:
        return None
    t = Table(["configuration", "GPU", "peak alloc predicted", "measured", "error", "tokens/s/GPU predicted",
               "measured", "error"])
    mem_err, tps_err = [], []
    for r in rows:
        p, m = r.metrics.predicted, r.metrics
        e_mem = p["peak_mem_allocated_bytes"] / m.peak_mem_allocated_bytes - 1
        e_tps = p["tokens_per_s_per_gpu"] / m.tokens_per_s_per_gpu - 1
        mem_err.append(abs(e_mem))
        tps_err.append(abs(e_tps))
        t.add(ctx.label(r), f"{p['gpu']} x{m.world_size}", gib(p["peak_mem_allocated_bytes"]),
              gib(m.peak_mem_allocated_bytes), pct(e_mem, "+.1%"), fmt(p["tokens_per_s_per_gpu"], ",.0f"),
              fmt(m.tokens_per_s_per_gpu, ",.0f"), pct(e_tps, "+.1%"))
    s = Section("Planner: predicted vs measured")
    s.add(f"`tunebench plan`'s figures for each run's configuration and GPU against what it measured, over "
          f"{len(rows)} runs: peak memory within {MEMORY_GOAL:.0%} on {sum(e <= MEMORY_GOAL for e in mem_err)}, "
          f"median error {median(mem_err):.1%}; tokens/s within {SPEED_GOAL:.0%} on "
          f"{sum(e <= SPEED_GOAL for e in tps_err)}, median error {median(tps_err):.1%}.")
    return s.add(t)
