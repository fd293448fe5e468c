"""The timed loop: warmup steps, then the timed region, each step's loss watched for NaN.

The host never waits for the step it just queued. Each step's loss is copied to pinned host memory
asynchronously and read LAG steps later, so the GPU always has the next steps queued while a NaN
or Inf still stops the run within LAG steps.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tunebench.config import RunConfig
from tunebench.dist import SINGLE, DistContext
from tunebench.metrics.telemetry import Telemetry
from tunebench.metrics.timer import StepTimer
from tunebench.record import GpuTelemetry

LAG = 2  # steps between queuing a loss and reading it back on GPUs


@dataclass
class LoopResult:
    status: str = "ok"  # ok | nan
    error: str | None = None
    losses: list[float] = field(default_factory=list)  # every step run, warmup included
    wall_s: float = 0.0  # timed region
    step_times: list[float] = field(default_factory=list)  # timed steps only
    telemetry: GpuTelemetry | None = None  # NVML summary over the timed steps (GPU runs only)


def inject_fault(kind: str, step: int) -> None:
    """Testing the harness only (config key `fault`): die, hang or raise at a given step."""
    if kind == "abort":
        os.abort()  # a hard crash: no exception handler runs, no record is written by this process
    if kind == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected fault at step {step}")


def run_loop(step: Callable[[], torch.Tensor], cfg: RunConfig, device: torch.device,
             on_step: Callable[[int, float | None], None] | None = None, ctx: DistContext = SINGLE,
             telemetry: Telemetry | None = None) -> LoopResult:
    cuda = device.type == "cuda"
    lag = LAG if cuda else 0
    # A ring of LAG + 1 pinned slots: step k's loss lives in slot k % slots until it is read, LAG steps later.
    slots = lag + 1
    host = torch.zeros(slots, dtype=torch.float32, pin_memory=cuda)
    ready: list[torch.cuda.Event | None] = [None] * slots
    timer = StepTimer(device)
    result = LoopResult()
    last: float | None = None

    def read(k: int) -> bool:
        """Read step k's loss; False (and status nan) if it is not finite."""
        nonlocal last
        if ready[k % slots] is not None:
            ready[k % slots].synchronize()
        last = float(host[k % slots])
        result.losses.append(last)
        if not math.isfinite(last):
            result.status, result.error = "nan", f"loss became {last} at step {k}"
            return False
        return True

    fault_kind, _, fault_step = (cfg.fault or "").partition("@")
    for i in range(cfg.steps):
        if fault_kind and i == int(fault_step):
            inject_fault(fault_kind, i)
        if i == cfg.warmup:
            ctx.barrier()  # every rank starts the timed region together
            timer.start()
            if telemetry:
                telemetry.start()
        loss = step()
        host[i % slots].copy_(loss, non_blocking=cuda)
        if cuda:
            ready[i % slots] = torch.cuda.Event()
            ready[i % slots].record()
        if i >= cfg.warmup:
            timer.step_end()
        if i - lag >= 0 and not read(i - lag):
            break
        if on_step:
            on_step(i, last)
    else:
        for k in range(max(cfg.steps - lag, 0), cfg.steps):
            if not read(k):
                break
    if len(timer.marks) > 0:
        result.wall_s, result.step_times = timer.finish()
    if telemetry:
        result.telemetry = telemetry.stop()
    return result
