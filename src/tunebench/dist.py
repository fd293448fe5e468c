"""The process's place in a distributed run, read from the variables torchrun sets, and its process group."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    nnodes: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """Average of a tensor over ranks, in place and asynchronous (gloo has no AVG: sum then divide)."""
        if self.active and self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= self.world_size
        return t

    def gather(self, obj: object) -> list:
        if not self.active or self.world_size == 1:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


SINGLE = DistContext()


def from_env() -> DistContext:
    """The context torchrun describes; a plain process is rank 0 of 1."""
    if "RANK" not in os.environ:
        return SINGLE
    world = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return DistContext(rank=int(os.environ["RANK"]), world_size=world, local_rank=int(os.environ["LOCAL_RANK"]),
                       nnodes=max(1, world // max(local_world, 1)))


def init_process_group(ctx: DistContext, device: torch.device, timeout_s: float) -> None:
    """NCCL on GPUs, gloo on CPU; the timeout bounds how long a dead or stuck rank can hold the others."""
    if ctx.world_size == 1 and "RANK" not in os.environ:
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s), **kwargs)


def destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def rank_session(ctx: DistContext, device: torch.device, timeout_s: float) -> Iterator[DistContext]:
    """This rank's device and process group for the block. The group is destroyed only after a clean
    exit: after a failure torchrun ends the rank, and a teardown could wait on peers that are gone."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_process_group(ctx, device, timeout_s)
    yield ctx
    destroy()
