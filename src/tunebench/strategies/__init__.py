"""Data-parallel strategies. Each one is a small ``apply_*`` function returning a TrainStep.

A TrainStep knows how to run one micro-batch forward and backward (with or without gradient
synchronisation) and how to apply the optimizer; the loop above it is the same for all strategies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tunebench.config import BNB_OPTIMIZERS, RunConfig
from tunebench.errors import UserError

MicroFn = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]


@dataclass
class TrainStep:
    micro: MicroFn  # (input ids, labels, sync grads?) -> this micro-batch's loss / grad_accum, detached
    update: Callable[[], None]  # clip, optimizer step, zero grads (a no-op where micro does it all)


# method x strategy: what works, and why the rest is refused (README has the same matrix).
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("qlora", "fsdp"): "QLoRA with FSDP2 needs 4-bit weights stored as bf16 (quant_storage) sharded by FSDP, "
                       "not built yet; use ddp or single",
    ("qlora", "zero2"): "bitsandbytes 4-bit layers are not partitioned or cast by DeepSpeed; use ddp or single",
    ("qlora", "zero3"): "QLoRA with ZeRO-3 needs bf16 quant storage support, not built yet; use ddp or single",
}


def check_strategy(cfg: RunConfig, world_size: int) -> None:
    reason = UNSUPPORTED.get((cfg.method, cfg.strategy))
    if reason:
        raise UserError(f"invalid strategy={cfg.strategy} with method={cfg.method}: {reason}")
    if cfg.strategy == "single" and world_size > 1:
        raise UserError(f"invalid strategy=single with {world_size} processes: use ddp, fsdp, zero2 or zero3")
    if cfg.strategy in ("zero2", "zero3") and cfg.optimizer in BNB_OPTIMIZERS:
        raise UserError(f"invalid optimizer={cfg.optimizer} with strategy={cfg.strategy}: DeepSpeed shards the "
                        "optimizer itself; use adamw or adamw_fused")
    if cfg.strategy in ("zero2", "zero3"):
        try:
            import deepspeed  # noqa: F401
        except Exception:
            raise UserError(f"strategy={cfg.strategy} needs the 'deepspeed' package, which is not installed "
                            "(pip install --no-build-isolation deepspeed)") from None


def apply_strategy(module, blocks, cfg: RunConfig, device: torch.device, world_size: int) -> TrainStep:
    """Wrap `module` (the model with its loss) for cfg.strategy and build its optimizer."""
    if cfg.strategy == "single":
        from tunebench.strategies.single import apply_single

        return apply_single(module, cfg, device)
    if cfg.strategy == "ddp":
        from tunebench.strategies.ddp import apply_ddp

        return apply_ddp(module, cfg, device)
    if cfg.strategy == "fsdp":
        from tunebench.strategies.fsdp import apply_fsdp

        return apply_fsdp(module, blocks, cfg, device, world_size)
    from tunebench.strategies.zero import apply_zero

    return apply_zero(module, cfg, device, world_size, stage=2 if cfg.strategy == "zero2" else 3)
