"""From each rank's own measurements to one set of global figures (DESIGN.md section 2).

Global tokens/s = tokens of the timed steps summed over ranks / the longest rank's timed wall time
(all ranks start the timed region together, after a barrier). A step's time is the slowest rank's,
since every rank waits for it at the next collective. Peak memory is the largest of any rank;
energy is summed over the ranks' GPUs, so energy per token is the run's joules / its timed tokens.
"""

from __future__ import annotations

import statistics

import torch

from tunebench.config import RunConfig
from tunebench.engine.loop import LoopResult
from tunebench.launch.context import DistContext
from tunebench.metrics.flops import FlopsPerToken, peak_flops, utilization
from tunebench.metrics.stats import summarize
from tunebench.metrics.telemetry import combine as combine_telemetry
from tunebench.record import StepTimes, TrainMetrics

MEMORY = ("peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "nvml_mem_used_bytes", "peak_rss_bytes")


def rank_summary(ctx: DistContext, host: str, loop: LoopResult, cfg: RunConfig, memory: dict) -> dict:
    samples = len(loop.step_times) * cfg.batch_size * cfg.grad_accum
    return {
        "rank": ctx.rank, "host": host, "timed_steps": len(loop.step_times), "tokens": samples * cfg.seq_len,
        "samples": samples, "wall_s": loop.wall_s, "step_times": loop.step_times,
        "tokens_per_s": samples * cfg.seq_len / loop.wall_s if loop.wall_s else None,
        "telemetry": loop.telemetry,
        **{k: memory.get(k) for k in MEMORY},
    }


def max_present(values: list) -> int | None:
    """The largest of the values that were measured (None where none was)."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def combine_ranks(ranks: list[dict], cfg: RunConfig, losses: list[float], flops: FlopsPerToken | None,
                  gpu_name: str | None, device: torch.device) -> TrainMetrics:
    world = len(ranks)
    m = TrainMetrics(world_size=world, losses=losses, loss_first=losses[0] if losses else None,
                     loss_last=losses[-1] if losses else None)
    for k in MEMORY:
        setattr(m, k, max_present([r[k] for r in ranks]))
    if world > 1:
        m.per_rank = [{k: v for k, v in r.items() if k != "step_times"}
                      | {"step_time_mean_s": statistics.fmean(r["step_times"]) if r["step_times"] else None}
                      for r in ranks]
    wall = max(r["wall_s"] for r in ranks)
    n_steps = min(r["timed_steps"] for r in ranks)
    if wall > 0 and n_steps > 0:
        m.timed_steps, m.timed_tokens, m.wall_s = n_steps, sum(r["tokens"] for r in ranks), wall
        m.tokens_per_s = m.timed_tokens / wall
        m.tokens_per_s_per_gpu = m.tokens_per_s / world
        m.samples_per_s = sum(r["samples"] for r in ranks) / wall
        m.samples_per_s_per_gpu = m.samples_per_s / world
        slowest = [max(r["step_times"][i] for r in ranks) for i in range(n_steps)]
        m.step_time_s = StepTimes(**summarize(slowest))
        means = [statistics.fmean(r["step_times"]) for r in ranks]
        m.step_time_skew = max(means) / min(means) - 1.0 if min(means) > 0 else None
    m.telemetry = combine_telemetry([r.get("telemetry") for r in ranks])
    if m.telemetry and m.timed_tokens:
        m.energy_j_per_token = m.telemetry["energy_j"] / m.timed_tokens
    if flops:
        m.flops_per_token, m.hfu_flops_per_token, m.flops_formula = flops.model, flops.hardware, flops.formula
        m.peak_flops = peak_flops(gpu_name) if device.type == "cuda" else None
        if m.tokens_per_s_per_gpu:
            m.mfu = utilization(flops.model, m.tokens_per_s_per_gpu, m.peak_flops)
            m.hfu = utilization(flops.hardware, m.tokens_per_s_per_gpu, m.peak_flops)
    return m
