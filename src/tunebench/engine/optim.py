"""Optimizer factory: PyTorch AdamW (foreach or fused) and bitsandbytes 8-bit / paged 8-bit AdamW."""

from __future__ import annotations

import torch

from tunebench.config import RunConfig


def build_optimizer(params: list[torch.nn.Parameter], cfg: RunConfig) -> torch.optim.Optimizer:
    kw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, foreach=True, **kw)
    if cfg.optimizer == "adamw_fused":
        return torch.optim.AdamW(params, fused=True, **kw)
    import bitsandbytes as bnb

    if cfg.optimizer == "adamw_8bit":
        return bnb.optim.AdamW8bit(params, **kw)
    return bnb.optim.PagedAdamW8bit(params, **kw)  # paged_adamw_8bit
