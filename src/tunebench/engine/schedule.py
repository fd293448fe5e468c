"""Learning-rate schedules: linear warmup from 0, then cosine or linear decay to 0, or constant."""

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
