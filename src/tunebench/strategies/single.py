"""One process, no wrapping."""

from __future__ import annotations

import torch
from torch import nn

from tunebench.config import RunConfig
from tunebench.engine.optim import build_optimizer, param_groups
from tunebench.engine.step import TrainStep, torch_step
from tunebench.strategies.state import Replicated


def apply(module: nn.Module, blocks: nn.ModuleList, cfg: RunConfig, device: torch.device, world_size: int) -> TrainStep:
    params = [p for p in module.parameters() if p.requires_grad]
    # replayed as CUDA graphs, several micro-batches' gradients are summed into gradients that always exist
    kept = cfg.cuda_graphs is True and cfg.grad_accum > 1  # true only compiled whole (Strategy.check, resolved)
    ts = torch_step(module, params, build_optimizer(param_groups(module, params, cfg.weight_decay), cfg), cfg, device,
                    grads_kept=kept)
    ts.state = Replicated(module, ts.optimizer)
    return ts
