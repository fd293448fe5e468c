"""One process, no wrapping."""

from __future__ import annotations

import torch
from torch import nn

from tunebench.config import RunConfig
from tunebench.engine.loop import torch_step
from tunebench.engine.optim import build_optimizer
from tunebench.strategies import TrainStep


def apply_single(module: nn.Module, cfg: RunConfig, device: torch.device) -> TrainStep:
    params = [p for p in module.parameters() if p.requires_grad]
    return torch_step(module, params, build_optimizer(params, cfg), cfg, device)
