"""PyTorch DistributedDataParallel: full replicas, gradients all-reduced in 100 MB buckets."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tunebench.config import RunConfig
from tunebench.engine.optim import build_optimizer, param_groups
from tunebench.engine.step import TrainStep, torch_step
from tunebench.strategies.state import Replicated

# 100 MB buckets, not DDP's 25: fewer all-reduces, and fewer pieces of the graph dynamo cuts at each bucket (faster
# where measured: benchmarks/results/distributed.md). Larger buckets are slower again: less of the all-reduce
# overlaps the backward.
BUCKET_MB = 100


def apply(module: nn.Module, blocks: nn.ModuleList, cfg: RunConfig, device: torch.device, world_size: int) -> TrainStep:
    # init_sync=False: every rank built identical weights from the same seed (or the same files), so
    # the start-up broadcast is not needed, and it would not carry bitsandbytes' 4-bit quant state.
    ddp = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                  bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=True, init_sync=False)
    params = [p for p in ddp.parameters() if p.requires_grad]
    ts = torch_step(ddp, params, build_optimizer(param_groups(ddp, params, cfg.weight_decay), cfg), cfg, device,
                    no_sync=ddp.no_sync)
    ts.state = Replicated(module, ts.optimizer)
    return ts
