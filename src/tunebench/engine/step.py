"""The training step every strategy shares: one micro-batch forward and backward, then the update.

A strategy (tunebench.strategies) wraps the model its way and returns a TrainStep; the loop above
it is the same for all of them. The PyTorch strategies (single, DDP, FSDP2) share `torch_step`:
autocast, the fp16 grad scaler, accumulation without gradient sync, clipping and the optimizer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from tunebench.config import RunConfig
from tunebench.dist import SINGLE, DistContext

MicroFn = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]


@dataclass
class TrainStep:
    micro: MicroFn  # (input ids, labels, sync grads?) -> this micro-batch's loss / grad_accum, detached
    update: Callable[[], None]  # clip, optimizer step, zero grads (a no-op where micro does it all)


class Batches(Protocol):
    """Where a step's micro-batches come from (engine.data): input ids and their shifted labels."""

    def next(self) -> tuple[torch.Tensor, torch.Tensor]: ...


def autocast(cfg: RunConfig, device: torch.device) -> contextlib.AbstractContextManager:
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def torch_step(module: torch.nn.Module, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
               cfg: RunConfig, device: torch.device,
               no_sync: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> TrainStep:
    """The step of the PyTorch strategies (single, DDP, FSDP2); `no_sync` skips gradient reduction."""
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None

    def micro(ids: torch.Tensor, labels: torch.Tensor, sync: bool) -> torch.Tensor:
        with contextlib.nullcontext() if sync else no_sync():
            with autocast(cfg, device):
                loss = module(ids, labels) / cfg.grad_accum
            (scaler.scale(loss) if scaler else loss).backward()
        return loss.detach().float()

    def update() -> None:
        if scaler:
            scaler.unscale_(optimizer)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=True)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return TrainStep(micro, update)


def optimizer_step_fn(ts: TrainStep, data: Batches, cfg: RunConfig, device: torch.device,
                      ctx: DistContext = SINGLE) -> Callable[[], torch.Tensor]:
    """One optimizer step over `grad_accum` micro-batches; returns the global mean loss (on device)."""

    def step() -> torch.Tensor:
        total = torch.zeros((), device=device)
        for k in range(cfg.grad_accum):
            ids, labels = data.next()
            total += ts.micro(ids, labels, k == cfg.grad_accum - 1)
        ts.update()
        return ctx.mean(total)

    return step
