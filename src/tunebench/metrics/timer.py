"""Step timing: device-clock events per step on GPUs, perf_counter on CPU; wall time around the region.

No host synchronisation inside the timed region: CUDA events are recorded into the stream and read
once at the end.
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer:
    """Marks around each timed step. `pause()`/`resume()` keep work between steps (evaluation, checkpoints)
    out: the next step is measured from the resume, and the wall time leaves the pause out."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.spans: list[tuple] = []  # (start mark, end mark) of each timed step
        self._start = None
        self.t0 = 0.0
        self.paused_s = 0.0
        self._paused_at: float | None = None

    @property
    def started(self) -> bool:
        return self._start is not None

    def start(self) -> None:
        synchronize(self.device)
        self.t0 = time.perf_counter()
        self._start = self._mark()

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def step_end(self) -> None:
        end = self._mark()
        self.spans.append((self._start, end))
        self._start = end

    def elapsed(self) -> float:
        """Host seconds in the timed region so far, pauses left out (0 before it starts)."""
        return time.perf_counter() - self.t0 - self.paused_s if self.started else 0.0

    def pause(self) -> None:
        if self.started:
            synchronize(self.device)
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            synchronize(self.device)
            self.paused_s += time.perf_counter() - self._paused_at
            self._paused_at = None
            self._start = self._mark()  # the next step is measured from here

    def finish(self) -> tuple[float, list[float]]:
        """Wall seconds of the whole region (pauses left out) and the seconds of each step in it."""
        synchronize(self.device)
        wall = time.perf_counter() - self.t0 - self.paused_s
        if self.cuda:
            return wall, [a.elapsed_time(b) / 1e3 for a, b in self.spans]
        return wall, [b - a for a, b in self.spans]


def time_calls(fn, device: torch.device, iters: int, warmup: int = 0, before=None) -> list[float]:
    """Seconds of each of `iters` calls of `fn`, after `warmup` untimed calls.

    `before` runs before every call outside the timed span (mamf-finder flushes the L2 cache there).
    On GPUs each call sits between two CUDA events and nothing waits for the host; on CPU
    perf_counter brackets the (synchronous) call.
    """
    for _ in range(warmup):
        if before:
            before()
        fn()
    synchronize(device)
    spans = []
    for _ in range(iters):
        if before:
            before()
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            spans.append((a, b))
        else:
            t0 = time.perf_counter()
            fn()
            spans.append(time.perf_counter() - t0)
    synchronize(device)
    return [a.elapsed_time(b) / 1e3 for a, b in spans] if device.type == "cuda" else spans
