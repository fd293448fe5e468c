"""FSDP2: ``fully_shard`` on each transformer block, then on the root; bf16 compute, fp32 reduction (bf16 under
bf16-pure); with ``shard_size`` below the world size, HSDP (groups of ranks each sharding a replica)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from tunebench.config import RunConfig
from tunebench.engine.optim import build_optimizer, param_groups
from tunebench.engine.step import TrainStep, torch_step
from tunebench.strategies.state import Sharded

COMPUTE = {"bf16": torch.bfloat16, "bf16-pure": torch.bfloat16, "fp16": torch.float16}


def _policies(cfg: RunConfig) -> tuple[MixedPrecisionPolicy, MixedPrecisionPolicy]:
    """(the root's policy, the blocks'). Gradients reduce in fp32 where an fp32 master copy takes them; under
    bf16-pure the shards keep bf16 gradients, so an fp32 reduce-scatter would only double its bytes and add a
    copy of every gradient each way (as DDP, which reduces in the gradients' dtype)."""
    reduce = torch.bfloat16 if cfg.precision == "bf16-pure" else torch.float32
    # The root takes token ids and, for DPO with its reference precomputed, the reference's log-probabilities summed
    # over each answer: cast to bf16 those would round (a sum near -300 to a step of 2), so nothing is cast
    root = MixedPrecisionPolicy(param_dtype=COMPUTE.get(cfg.precision), reduce_dtype=reduce, cast_forward_inputs=False)
    # Blocks take their inputs as they come (bf16 from the bf16 embeddings): under Hugging Face's checkpointing
    # FSDP's hook runs inside the checkpointed call, and before torch 2.13 it skipped the input cast when
    # recomputing, so a cast in forward only made the recompute's dtypes differ (CheckpointError on GPU).
    return root, MixedPrecisionPolicy(param_dtype=root.param_dtype, reduce_dtype=reduce, cast_forward_inputs=False)


def _mesh(device: torch.device, world_size: int, shard_size: int | None):
    """All ranks sharding one copy (FSDP), or HSDP: groups of `shard_size` consecutive ranks (torchrun numbers a
    node's processes together) each shard a copy, and the groups all-reduce their gradient shards."""
    if not shard_size or shard_size == world_size:
        return init_device_mesh(device.type, (world_size,))
    return init_device_mesh(device.type, (world_size // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))


def apply(module: nn.Module, blocks: nn.ModuleList, cfg: RunConfig, device: torch.device,
          world_size: int, materialize: Callable[[], None] | None = None) -> TrainStep:
    """Shard each block, then the root; `materialize` then makes this rank's shards of a model built on meta."""
    mesh = _mesh(device, world_size, cfg.shard_size)
    mp, block_mp = _policies(cfg)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=block_mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)  # the root: embeddings, final norm, head
    if materialize is not None:
        materialize()

    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        module.set_requires_gradient_sync(False)  # accumulate unsharded grads, reduce-scatter once
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    params = [p for p in module.parameters() if p.requires_grad]
    ts = torch_step(module, params, build_optimizer(param_groups(module, params, cfg.weight_decay), cfg), cfg, device,
                    no_sync=no_sync)
    if cfg.float8 == "tensorwise":  # weights all-gathered in float8 (models.float8): their scales once per step
        from tunebench.models.float8 import precompute_scales

        step = ts.update

        def update() -> None:
            step()
            precompute_scales(module)

        ts.update = update
    ts.state = Sharded(module, ts.optimizer, frozen_base=cfg.method != "full")
    return ts


def shard_frozen(module: nn.Module, blocks: nn.ModuleList, cfg: RunConfig, device: torch.device,
                 world_size: int) -> None:
    """A frozen model (DPO's reference) sharded as `apply` shards the policy: each block, then the root; no
    optimizer, no gradients."""
    mesh = _mesh(device, world_size, cfg.shard_size)
    mp, block_mp = _policies(cfg)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=block_mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
