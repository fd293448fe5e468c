"""The training step every strategy shares: one micro-batch forward and backward, then the update.

A strategy (tunebench.strategies) wraps the model its way and returns a TrainStep; the loop above
it is the same for all of them. The PyTorch strategies (single, DDP, FSDP2) share `torch_step`:
autocast, the fp16 grad scaler, accumulation without gradient sync, clipping and the optimizer.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from tunebench.config import RunConfig
from tunebench.dist import SINGLE, DistContext
from tunebench.engine.data import Batch
from tunebench.engine.offload import activation_offload
from tunebench.engine.preference import WITH_REFERENCE
from tunebench.errors import UserError

MicroFn = Callable[[Batch, bool], torch.Tensor]


@dataclass
class TrainStep:
    micro: MicroFn  # (batch, sync grads?) -> this micro-batch's loss / grad_accum, detached
    update: Callable[[], None]  # clip, optimizer step, zero grads (a no-op where micro does it all)
    module: torch.nn.Module | None = None  # what the strategy wrapped (DDP, FSDP2 or DeepSpeed's engine)
    optimizer: torch.optim.Optimizer | None = None  # the optimizer whose learning rate a schedule sets
    state: Any = None  # the strategy's checkpoint access (engine.checkpoint.StateAccess)


class Batches(Protocol):
    """Where a step's micro-batches come from: synthetic tokens (engine.data) or a dataset (tunebench.data)."""

    def next(self) -> Batch: ...


def autocast(cfg: RunConfig, device: torch.device, cache: bool = True) -> contextlib.AbstractContextManager:
    """Mixed precision as the precision asks. `cache`: keep each weight's 16-bit copy until the context ends, as
    a training forward wants (its backward uses them); an evaluation loop without it holds one weight's copy at a
    time (a train job evaluating beside its CUDA graphs' pools peaks lower without every weight's bf16 copy kept;
    benchmarks/results/training-jobs.md)."""
    if cfg.precision in ("fp32", "bf16-pure"):  # nothing to cast: the weights already are what computes
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)


@contextlib.contextmanager
def attention_kernels(cfg: RunConfig, device: torch.device) -> Iterator[None]:
    """SDPA's kernels in the order `attn_kernel` says, every backend still allowed (one that cannot take the
    inputs passes them to the next). Entered around the whole loop: a checkpoint's recompute in backward must pick
    the kernel the forward picked (their saved tensors differ), and compile's tracing fixes it in the graph. The
    order also tags compile's caches, whose keys do not include it (a graph traced with one kernel was found
    reused for the other across processes). auto leaves PyTorch's order: cuDNN's kernel alone is faster on Hopper
    (benchmarks/compare/kernels_vs.py), but whole steps were no faster with it (GPT-2 small compiled whole,
    Mistral-7B QLoRA without checkpointing and keeping matmuls; benchmarks/results/full-finetune.md)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    first = cfg.attn_kernel
    if cfg.attn != "sdpa" or first == "auto" or device.type != "cuda":
        yield
        return
    order = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rest = [b for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.MATH) if b != order[first]]
    if "set_priority" not in inspect.signature(sdpa_kernel).parameters:
        raise UserError(f"attn_kernel={first} needs torch >= 2.6 (SDPA's kernel order); this is {torch.__version__}")
    with sdpa_kernel([order[first], *rest], set_priority=True), \
            torch.compiler.config.patch(cache_key_tag=f"sdpa-{first}-first"):
        yield


@contextlib.contextmanager
def matmul_precision(cfg: RunConfig) -> Iterator[None]:
    """fp32 matmuls in TF32 where `tf32` asks, restored after (inductor's caches key on the setting)."""
    if not cfg.tf32:
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def reference_numerics(cfg: RunConfig) -> Iterator[None]:
    """Compiled DPO: every 16-bit intermediate rounded where eager rounds it, so that a reference compiled apart from
    the policy (full fine-tuning's frozen copy) rounds as the policy's graph does where they are the same function.

    Inductor keeps a fused kernel's intermediates in fp32 by default, and the two graphs differ (the reference's
    without gradients, the policy's with its checkpoint traced inside the block): their fusions differ, so would
    their roundings, and DPO reads the difference of their log-probabilities summed over whole answers. With eager's
    casts emulated both round alike (the casts are elementwise and fused); what remains is where their kernels sum
    in different orders. LoRA's reference runs the policy's own graph instead (methods.adapter_gate)."""
    if cfg.objective not in WITH_REFERENCE or cfg.compile is not True:  # a resolved config: compile is a bool
        yield
        return
    import torch._inductor.config as inductor  # here: importing inductor is slow

    with inductor.patch(emulate_precision_casts=True):
        yield


@contextlib.contextmanager
def kernel_settings(cfg: RunConfig, device: torch.device) -> Iterator[None]:
    """What the benchmark measured its kernels under, around the whole loop: SDPA's order, fp32's matmuls and, for
    DPO, 16-bit rounding as eager's. Kernels compile on first use, inside it."""
    with attention_kernels(cfg, device), matmul_precision(cfg), reference_numerics(cfg):
        yield


def torch_step(module: torch.nn.Module, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
               cfg: RunConfig, device: torch.device,
               no_sync: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
               grads_kept: bool = False) -> TrainStep:
    """The step of the PyTorch strategies (single, DDP, FSDP2); `no_sync` skips gradient reduction.

    `grads_kept`: every gradient exists from the start and is zeroed in place, never freed. A CUDA graph's
    backward writes its gradients into the graph's own memory, and autograd takes a first gradient as the
    parameter's .grad without a copy: the next micro-batch's replay would overwrite it before it is added to
    (PyTorch's cudagraph trees with accumulation: the sum came out as the last micro-batch's alone). With the
    gradient already there, autograd adds each micro-batch's into it."""
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    if grads_kept:
        for p in params:
            p.grad = torch.zeros_like(p)
    saving = activation_offload(cfg.offload, device, module)  # where the forward's saved activations wait

    def micro(batch: Batch, sync: bool) -> torch.Tensor:
        with contextlib.nullcontext() if sync else no_sync():
            with autocast(cfg, device), saving():
                loss = module(*batch) / cfg.grad_accum
            (scaler.scale(loss) if scaler else loss).backward()
        return loss.detach().float()

    def update() -> None:
        if scaler:
            scaler.unscale_(optimizer)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=True)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=not grads_kept)

    return TrainStep(micro, update, module, optimizer)


def optimizer_step_fn(ts: TrainStep, data: Batches, cfg: RunConfig, device: torch.device,
                      ctx: DistContext = SINGLE, after_update: Callable[[], None] | None = None,
                      stop_flag: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
    """One optimizer step over `grad_accum` micro-batches; returns the global mean loss (on device).

    `after_update` runs after the optimizer (a learning-rate schedule). With `stop_flag` (a 0/1 tensor on the
    device, set by a signal handler) the step returns [loss, stop] averaged over ranks in one all-reduce, so
    every rank learns of a stop request at the same step."""

    def step() -> torch.Tensor:
        total = torch.zeros((), device=device)
        for k in range(cfg.grad_accum):
            total += ts.micro(data.next(), k == cfg.grad_accum - 1)
        ts.update()
        if after_update:
            after_update()
        return ctx.mean(total if stop_flag is None else torch.stack([total, stop_flag.float()]))

    return step
