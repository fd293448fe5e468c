"""What every command checks before any weight exists, and the Plan those checks produce.

`run_preflight.preflight` (training), `hw.preflight`, `inference.load.preflight` and
`inference.generate.preflight` each raise UserError for bad input and return a Plan: the
validated config, the device it runs on, the model it needs (if any) and the world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tunebench.errors import invalid


@dataclass(frozen=True)
class Plan:
    cfg: Any  # the command's validated config (RunConfig, HwConfig, LoadConfig, InferConfig)
    device: torch.device
    spec: Any = None  # models.ModelSpec where the command builds a model
    world_size: int = 1
    strategy: Any = None  # strategies.Strategy for training
    requested: Any = None  # the config as given, where `cfg` made its 'auto' choices for the device


def resolve_device(choice: str, local_rank: int = 0) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise invalid("device", choice, "no CUDA GPU is visible to PyTorch on this machine (use cpu or auto)")
    return torch.device("cuda", local_rank)


def nproc_per_node(cfg: Any, device: torch.device) -> int:
    """Default: every visible GPU for a distributed strategy; one process for single and on CPU."""
    if cfg.nproc_per_node:
        return cfg.nproc_per_node
    return torch.cuda.device_count() if device.type == "cuda" and cfg.strategy != "single" else 1
