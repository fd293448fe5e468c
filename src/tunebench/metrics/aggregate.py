"""From each rank's own measurements to one set of global figures (docs/metrics.md).

Global tokens/s = tokens of the timed steps summed over ranks / the longest rank's timed wall time
(all ranks start the timed region together, after a barrier). A step's time is the slowest rank's,
since every rank waits for it at the next collective. Peak memory is the largest of any rank;
energy is summed over the ranks' GPUs, so energy per token is the run's joules / its timed tokens.
"""

from __future__ import annotations

import statistics

from tunebench.metrics.flops import FlopsPerToken, utilization
from tunebench.metrics.stats import summarize
from tunebench.metrics.telemetry import combine as combine_telemetry
from tunebench.record import GpuTelemetry, RankFigures, StepTimes, TrainMetrics

MEMORY = ("peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "nvml_mem_used_bytes", "peak_rss_bytes")


def rank_figures(rank: int, host: str, step_times: list[float], wall_s: float, samples_per_step: int,
                 seq_len: int, memory: dict, telemetry: GpuTelemetry | None) -> RankFigures:
    """One rank's figures from its timed steps (`samples_per_step` = micro-batch x accumulation)."""
    samples = len(step_times) * samples_per_step
    return RankFigures(rank=rank, host=host, timed_steps=len(step_times), tokens=samples * seq_len, samples=samples,
                       wall_s=wall_s, step_times=step_times,
                       tokens_per_s=samples * seq_len / wall_s if wall_s else None, telemetry=telemetry,
                       **{k: memory.get(k) for k in MEMORY})


def max_present(values: list) -> int | None:
    """The largest of the values that were measured (None where none was)."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def combine_ranks(ranks: list[RankFigures], losses: list[float], flops: FlopsPerToken | None,
                  peak: float | None) -> TrainMetrics:
    """The run's metrics from every rank's figures; `peak` is the GPU's dense bf16 FLOP/s (None: no MFU)."""
    world = len(ranks)
    m = TrainMetrics(world_size=world, losses=losses, loss_first=losses[0] if losses else None,
                     loss_last=losses[-1] if losses else None)
    for k in MEMORY:
        setattr(m, k, max_present([getattr(r, k) for r in ranks]))
    if world > 1:
        m.per_rank = [r.model_copy(update={"step_time_mean_s": statistics.fmean(r.step_times) if r.step_times
                                           else None}) for r in ranks]
    wall = max(r.wall_s for r in ranks)
    n_steps = min(r.timed_steps for r in ranks)
    if wall > 0 and n_steps > 0:
        m.timed_steps, m.timed_tokens, m.wall_s = n_steps, sum(r.tokens for r in ranks), wall
        m.tokens_per_s = m.timed_tokens / wall
        m.tokens_per_s_per_gpu = m.tokens_per_s / world
        m.samples_per_s = sum(r.samples for r in ranks) / wall
        m.samples_per_s_per_gpu = m.samples_per_s / world
        slowest = [max(r.step_times[i] for r in ranks) for i in range(n_steps)]
        m.step_time_s = StepTimes(**summarize(slowest))
        means = [statistics.fmean(r.step_times) for r in ranks]
        m.step_time_skew = max(means) / min(means) - 1.0 if min(means) > 0 else None
    m.telemetry = combine_telemetry([r.telemetry for r in ranks])
    if m.telemetry and m.timed_tokens:
        m.energy_j_per_token = m.telemetry.energy_j / m.timed_tokens
    if flops:
        m.flops_per_token, m.hfu_flops_per_token, m.flops_formula = flops.model, flops.hardware, flops.formula
        m.peak_flops = peak
        if m.tokens_per_s_per_gpu:
            m.mfu = utilization(flops.model, m.tokens_per_s_per_gpu, peak)
            m.hfu = utilization(flops.hardware, m.tokens_per_s_per_gpu, peak)
            m.mfu_noncausal = utilization(flops.model_noncausal, m.tokens_per_s_per_gpu, peak)
    return m
