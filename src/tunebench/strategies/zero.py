"""DeepSpeed ZeRO stage 2 (optimizer state and gradients sharded) and stage 3 (parameters too).

Batch settings are explicit integers (the seeds' "auto" strings broke DeepSpeed's batch assertion).
The optimizer is ours (the same AdamW as the other strategies), which DeepSpeed wraps and shards.
"""

from __future__ import annotations

import torch
from torch import nn

from tunebench.config import RunConfig
from tunebench.engine.optim import build_optimizer
from tunebench.engine.step import TrainStep
from tunebench.strategies.state import DeepSpeedState


def ds_config(cfg: RunConfig, stage: int, world_size: int) -> dict:
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": int(5e8)}
    if stage == 2:
        zero["allgather_bucket_size"] = int(5e8)
    else:
        zero |= {"stage3_prefetch_bucket_size": int(5e8), "stage3_max_live_parameters": int(1e9),
                 "stage3_param_persistence_threshold": int(1e5)}
    return {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.batch_size * cfg.grad_accum * world_size,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.precision == "bf16"},
        "fp16": {"enabled": cfg.precision == "fp16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def apply(module: nn.Module, blocks: nn.ModuleList, cfg: RunConfig, device: torch.device, world_size: int,
          stage: int) -> TrainStep:
    import deepspeed

    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, cfg)
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=ds_config(cfg, stage, world_size),
                                      dist_init_required=False)

    def micro(batch, sync: bool) -> torch.Tensor:
        loss = engine(*batch)
        engine.backward(loss)  # DeepSpeed divides by grad_accum itself
        engine.step()  # steps the optimizer only at the accumulation boundary
        return loss.detach().float() / cfg.grad_accum

    # `optimizer`: ours, whose param groups DeepSpeed's optimizer steps with (a schedule sets their lr)
    return TrainStep(micro, update=lambda: None, module=engine, optimizer=optimizer,
                     state=DeepSpeedState(engine, stage, quantized_base=cfg.method == "qlora"))
