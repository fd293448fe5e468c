"""The timed loop: warmup steps, then the timed region, each step's loss watched for NaN.

The host never waits for the step it just queued. Each step's loss is copied to pinned host memory
asynchronously and read LAG steps later, so the GPU always has the next steps queued while a NaN
or Inf still stops the run within LAG steps. A benchmark runs this loop bare; a training job passes
hooks (evaluate, checkpoint, log, stop on a signal), whose time is left out of the step times.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from tunebench import watchdog
from tunebench.dist import SINGLE, DistContext
from tunebench.metrics.memory import mark_timed
from tunebench.metrics.telemetry import Telemetry
from tunebench.metrics.timer import StepTimer
from tunebench.record import GpuTelemetry

LAG = 2  # steps between queuing a loss and reading it back on GPUs
CHECK_STEPS = 3  # timed steps after which a run slower than LoopSpec.max_step_s is abandoned


@dataclass(frozen=True)
class LoopSpec:
    steps: int  # the last step (exclusive), counted from the start of the job
    warmup: int  # steps (from `start`) left out of the timed region
    start: int = 0  # steps already done (a resumed job)
    fault: str | None = None  # testing the harness: abort@STEP, hang@STEP or raise@STEP
    max_step_s: float | None = None  # abandon after CHECK_STEPS timed steps slower than this on average


@dataclass
class LoopResult:
    status: str = "ok"  # ok | nan
    error: str | None = None
    losses: list[float] = field(default_factory=list)  # every step run, warmup included
    wall_s: float = 0.0  # timed region (hook time left out)
    step_times: list[float] = field(default_factory=list)  # timed steps only
    telemetry: GpuTelemetry | None = None  # NVML summary over the timed steps (GPU runs only)
    stopped: bool = False  # a stop was requested (a signal) and the loop ended at a step boundary
    done: int = 0  # steps completed, counted from the start of the job
    abandoned: bool = False  # ended after CHECK_STEPS timed steps: slower than max_step_s


class Hooks(Protocol):
    """What a training job does between steps. `due(done)` must give the same answer on every rank."""

    def due(self, done: int) -> bool: ...

    def run(self, done: int, result: LoopResult, stop: bool) -> bool: ...  # True ends the loop

    # `loss_step`: the step whose loss is result.losses[-1] (0: none read yet); on GPUs it trails `done` by LAG
    def log(self, done: int, result: LoopResult, timed_s: float, timed_steps: int, loss_step: int) -> None: ...


def inject_fault(kind: str, step: int) -> None:
    """Testing the harness only (config key `fault`): die, hang or raise at a given step."""
    if kind == "abort":
        os.abort()  # a hard crash: no exception handler runs, no record is written by this process
    if kind == "hang":
        while True:
            time.sleep(60)
    raise RuntimeError(f"injected fault at step {step}")


class _Reader:
    """Losses (and a stop request) read back LAG steps after their step was queued."""

    def __init__(self, cuda: bool, lag: int, result: LoopResult):
        self.cuda, self.lag, self.result = cuda, lag, result
        self.slots = lag + 1  # a ring: step k's values live in slot k % slots until they are read
        self.host = torch.zeros(self.slots, 2, dtype=torch.float32, pin_memory=cuda)
        self.ready: list[torch.cuda.Event | None] = [None] * self.slots
        self.last: float | None = None
        self.stop = False
        self.pending: list[int] = []
        self.read_upto = -1  # the last step read back: the device has finished it

    def queue(self, k: int, values: torch.Tensor) -> None:
        self.host[k % self.slots, : values.numel()].copy_(values.reshape(-1), non_blocking=self.cuda)
        if self.cuda:
            self.ready[k % self.slots] = torch.cuda.Event()
            self.ready[k % self.slots].record()
        self.pending.append(k)

    def read(self, upto: int) -> bool:
        """Read every queued step up to `upto`; False (and status nan) at the first non-finite loss."""
        while self.pending and self.pending[0] <= upto:
            k = self.pending.pop(0)
            if self.ready[k % self.slots] is not None:
                self.ready[k % self.slots].synchronize()
            self.read_upto = k
            self.last = float(self.host[k % self.slots, 0])
            self.stop = self.stop or float(self.host[k % self.slots, 1]) > 0
            self.result.losses.append(self.last)
            if not math.isfinite(self.last):
                self.result.status, self.result.error = "nan", f"loss became {self.last} at step {k}"
                return False
        return True


def run_loop(step: Callable[[], torch.Tensor], spec: LoopSpec, device: torch.device,
             on_step: Callable[[int, float | None], None] | None = None, ctx: DistContext = SINGLE,
             telemetry: Telemetry | None = None, hooks: Hooks | None = None) -> LoopResult:
    cuda = device.type == "cuda"
    result = LoopResult(done=spec.start)
    reader = _Reader(cuda, LAG if cuda else 0, result)
    timer = StepTimer(device)
    fault_kind, _, fault_step = (spec.fault or "").partition("@")
    watchdog.rest()  # the first step (compilation, autotuning) is not bounded by the step timeout
    for i in range(spec.start, spec.steps):
        if fault_kind and i == int(fault_step):
            inject_fault(fault_kind, i)
        if i == spec.start + spec.warmup:
            ctx.barrier()  # every rank starts the timed region together
            timer.start()
            mark_timed(device)
            if telemetry:
                telemetry.start()
        reader.queue(i, step())
        if i >= spec.start + spec.warmup:
            timer.step_end()
        result.done = i + 1
        watchdog.beat()
        if not reader.read(i - reader.lag):
            break
        if on_step:
            on_step(i, reader.last)
        if hooks and _between_steps(hooks, i + 1, reader, timer, result, spec):
            break
        if spec.max_step_s and i + 1 == spec.start + spec.warmup + CHECK_STEPS and _too_slow(timer, spec, ctx):
            result.abandoned = True
            reader.read(i)
            break
    else:
        reader.read(spec.steps)
    watchdog.rest()  # what follows the loop (saving, exporting) has no steps to beat
    if timer.started:
        result.wall_s, result.step_times = timer.finish()
    if telemetry:
        result.telemetry = telemetry.stop()
    return result


def _too_slow(timer: StepTimer, spec: LoopSpec, ctx: DistContext) -> bool:
    """Every rank's verdict at once (one all-reduce), so all of them stop at the same step or none does."""
    timer.pause()  # waits for the queued steps
    slow = torch.tensor([1.0 if timer.elapsed() / CHECK_STEPS > spec.max_step_s else 0.0], device=timer.device)
    timer.resume()
    return float(ctx.mean(slow)) > 0


def _between_steps(hooks: Hooks, done: int, reader: _Reader, timer: StepTimer, result: LoopResult,
                   spec: LoopSpec) -> bool:
    """The hooks after `done` steps; True ends the loop. Their time is kept out of the step times."""
    # the timed steps the device has finished, not those queued: the host runs up to LAG steps ahead, which early
    # in the timed region overstated the rate (a few steps in, a job logged tokens/s and an MFU far above its real ones)
    due = hooks.due(done) or reader.stop or done == spec.steps
    finite = reader.read(done) if due else True  # every loss up to here, before an evaluation or a checkpoint
    hooks.log(done, result, timer.elapsed(), max(0, reader.read_upto + 1 - (spec.start + spec.warmup)),
              reader.read_upto + 1)
    if not due:
        return False
    if not finite:
        return True
    timer.pause()
    result.stopped = reader.stop
    end = hooks.run(done, result, reader.stop)
    timer.resume()
    return end or reader.stop
