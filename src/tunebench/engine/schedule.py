"""Learning-rate schedules: linear warmup from 0, then cosine or linear decay to 0, or constant.

Warmup's first step already runs at 1/warmup of the rate (Hugging Face's linear warmup runs it at 0, a step
that changes nothing but Adam's moments); the rate reaches the full value at step `warmup`."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def lr_factor(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """The multiplier of the base learning rate after `step` optimizer steps."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return factor


def scheduler(optimizer: torch.optim.Optimizer, schedule: str, warmup: int, total: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(schedule, warmup, total))


def lr_of_step(sched: torch.optim.lr_scheduler.LambdaLR, step: int) -> float:
    """The learning rate optimizer step `step` (counted from 1) ran at. The scheduler moves to the next step's
    rate as soon as a step is done, so its get_last_lr() after step N is step N+1's."""
    return sched.base_lrs[0] * sched.lr_lambdas[0](step - 1)
