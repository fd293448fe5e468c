"""The host's speed at launching work: one CPU thread dispatching a small model's forward and backward.

A step that is host-bound (small or short micro-batches, blocks compiled apart) runs at the speed of the thread
that launches its kernels, and that differs between machines: the same GPT-2 small steps, compiled per block,
took longer on one machine's host than on another's, the GPUs idle meanwhile (benchmarks/results/planner.md). The
planner's host constants (plan.speed) were measured on one machine; this figure scales them to another.

The loop: LAYERS linears of WIDTH with tanh, forward, sum and backward, on the device: each kernel is a few
microseconds of GPU work, less than its launch, so the wall time per iteration is the host's.
"""

from __future__ import annotations

import statistics
import time

import torch

from tunebench.metrics.timer import synchronize

LAYERS = 16
WIDTH = 64
ROUNDS = 5  # the median of ROUNDS timed spans of `iters` iterations each


def dispatch(device: torch.device, iters: int, warmup: int) -> dict:
    """Microseconds per forward + backward of the loop (median and best of ROUNDS spans)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    weights = [torch.randn(WIDTH, WIDTH, generator=gen).div_(WIDTH ** 0.5).to(device).requires_grad_()
               for _ in range(LAYERS)]
    x = torch.randn(8, WIDTH, generator=gen).to(device)

    def step() -> None:
        y = x
        for w in weights:
            y = torch.tanh(y @ w)
        y.sum().backward()
        for w in weights:
            w.grad = None

    for _ in range(warmup):
        step()
    spans = []
    for _ in range(ROUNDS):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        synchronize(device)
        spans.append((time.perf_counter() - t0) / iters * 1e6)
    return {"layers": LAYERS, "width": WIDTH, "iters": iters, "rounds": ROUNDS, "us": statistics.median(spans),
            "best_us": min(spans)}
