"""DeepSpeed ZeRO stage 2 (optimizer state and gradients sharded) and stage 3 (parameters too).

Batch settings are explicit integers (the seeds' "auto" strings broke DeepSpeed's batch assertion).
The optimizer is ours (the same AdamW as the other strategies), which DeepSpeed wraps and shards; with
``offload=optimizer`` it is DeepSpeed's CPU Adam, which steps the fp32 partitions in host memory.
Stage 3 builds the model partitioned (``partitioning``): no rank ever holds it whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tunebench.config import RunConfig
from tunebench.engine.optim import Params, build_optimizer, param_groups
from tunebench.engine.step import TrainStep
from tunebench.strategies.state import DeepSpeedState


def ds_config(cfg: RunConfig, stage: int, world_size: int) -> dict:
    zero: dict = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": int(5e8)}
    if stage == 2:
        zero["allgather_bucket_size"] = int(5e8)
    else:
        zero |= {"stage3_prefetch_bucket_size": int(5e8), "stage3_max_live_parameters": int(1e9),
                 "stage3_param_persistence_threshold": int(1e5)}
    if cfg.offload == "optimizer":  # pinned: the gradients' copies to the host and the weights' back overlap
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    # Stage 2 in bf16: no loss scale to back off, so DeepSpeed's overflow check would only skip a step whose gradients
    # are not finite (the other strategies step, and the loop stops at a non-finite loss), at the cost of a serial
    # pass of small kernels and a host sync per parameter tensor every step. Stage 3 does not read the setting.
    return {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.batch_size * cfg.grad_accum * world_size,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.precision == "bf16"} | ({"check_grad_overflow": False} if stage == 2 else {}),
        "fp16": {"enabled": cfg.precision == "fp16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def _skip_shm_build() -> None:
    """DeepSpeed's communicator JIT-compiles a shared-memory all-reduce for the CPU when it starts (a C++ build,
    slow on a small machine) that only its inference all-reduce uses; training's collectives go through
    torch.distributed. Marked incompatible, it is not built (on GPUs there is no such op to build)."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def partitioning(cfg: RunConfig, world_size: int, stage: int) -> Any:
    """Stage 3: every module's parameters partitioned as soon as the module is built (zero.Init)."""
    import deepspeed
    import torch.distributed as dist

    # DeepSpeed reads the world size from its own communicator: wrap the process group torchrun's worker made
    _skip_shm_build()
    deepspeed.init_distributed(dist_backend=dist.get_backend())
    # mem_efficient_linear=False: it would replace torch.nn.functional.linear for the whole process
    return deepspeed.zero.Init(config_dict_or_path=ds_config(cfg, stage, world_size), mem_efficient_linear=False)


def host_optimizer(params: Params, cfg: RunConfig) -> torch.optim.Optimizer:
    """AdamW on the host, vectorised and multithreaded (DeepSpeed builds its C++ op the first time)."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, adamw_mode=True)


def apply(module: nn.Module, blocks: nn.ModuleList, cfg: RunConfig, device: torch.device, world_size: int,
          stage: int, materialize: Callable[[], None] | None = None) -> TrainStep:
    import deepspeed

    _skip_shm_build()  # deepspeed.initialize starts the communicator where partitioning did not
    if materialize is not None:  # the model was built partitioned: fill the partitions before the optimizer copies
        materialize()
    # with weight decay two groups (engine.optim.param_groups), each of which DeepSpeed flattens and shards apart
    params = param_groups(module, [p for p in module.parameters() if p.requires_grad], cfg.weight_decay)
    optimizer = host_optimizer(params, cfg) if cfg.offload == "optimizer" else build_optimizer(params, cfg)
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
