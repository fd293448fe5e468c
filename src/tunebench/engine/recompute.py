"""Activation checkpointing: which blocks recompute in backward, and what a checkpointed block keeps.

Hugging Face's checkpointing (what `grad_ckpt` turns on) keeps only a block's input and runs its whole forward
again in backward: every matmul twice. `ckpt_keep: matmuls` is op-level selective checkpointing (torchtitan's
"op" mode): the block also keeps the outputs of its large matmuls and of attention, so backward reruns only
the elementwise ops between them (norms, RoPE, SiLU, residual adds): it saves part of what full recompute saves,
for almost none of its time (no matmul runs twice). The checkpoint is put inside the block's own forward, so that a
compiled block traces it (torch.compile turns the policy into its recompute choices) and the block's hooks
(FSDP2's gathers) stay outside it.

A block recomputed whole has its checkpoint moved inside its forward too where blocks are compiled
(`ckpt_traced`, the default): the compiled forward then saves only the block's input, and backward's graph
holds the recompute fused with backward's own ops. Faster than Hugging Face's checkpoint around the block's call
for LoRA, QLoRA (where its 4-bit layers become plain ops in the graph) and full FSDP2 fine-tunes, for a little more
memory held while a block's backward runs (benchmarks/results/qlora-lora.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

_aten = torch.ops.aten
_MATMULS = (_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten._scaled_mm.default)
_ATTENTION = tuple(getattr(_aten, name).default for name in (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu") if hasattr(_aten, name))
# A matmul whose contraction is this many times narrower than its output is a LoRA adapter's second factor
# (rank r up to the layer's width): its output is as large as the layer's, needed by nothing in backward and
# cheap to redo, so it is not kept.
UP_PROJECTION = 8


def checkpoint_every(blocks: nn.ModuleList, every: int) -> None:
    """Keep Hugging Face's checkpointing on one block in `every` (it turned it on for all of them)."""
    for i, block in enumerate(blocks):
        block.gradient_checkpointing = i % every == 0


def no_input_grads(embeddings: nn.Module) -> None:
    """Drop the hooks that make the embeddings' output require grad. Hugging Face's checkpointing and peft each
    add one (each keeps the handle of its last only); only reentrant checkpointing needs them, and with a frozen
    base they make the first block compute input gradients nothing uses."""
    for key, hook in list(embeddings._forward_hooks.items()):
        if getattr(hook, "__name__", "") == "make_inputs_require_grads":
            del embeddings._forward_hooks[key]


def _keeps(op, args) -> bool:
    if op in _ATTENTION:
        return True
    if op not in _MATMULS:
        return False
    a, b = args[1:3] if op is _aten.addmm.default else args[:2]  # addmm(bias, a, b)
    return a.shape[-1] * UP_PROJECTION > b.shape[-1]


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if _keeps(op, args) else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward: Callable, context: Callable | None) -> Callable:
    # A function of ours, not a partial of torch's checkpoint: torch.compile does not start tracing in torch's own
    # files, so a compiled block would run the checkpoint eagerly, its policy a Python hook on every op (slower
    # than recomputing the whole block); traced from here, it becomes one graph.
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation: nothing to keep (as Hugging Face's checks self.training)
            return forward(*args, **kwargs)
        if context is None:  # everything recomputed (dynamo refuses torch's own no-op context_fn passed in)
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context, **kwargs)

    return run


def keep_matmuls(blocks: nn.ModuleList, every: int = 1) -> None:
    """Turn one checkpointed block in `every` (the 1st, (every+1)th, ... of them) into one that also keeps its
    matmuls' and attention's outputs; the others keep only their input."""
    context = functools.partial(create_selective_checkpoint_contexts, _policy)
    for k, block in enumerate([b for b in blocks if checkpointed_around(b)]):
        if k % every == 0:
            block.gradient_checkpointing = False  # Hugging Face's whole-block checkpoint off; ours goes inside
            block.forward = _checkpointed(block.forward, context)
            block.keeps_matmuls = True


def recompute_traced(blocks: Iterable[nn.Module]) -> None:
    """Move each block's whole-block checkpoint from around its call (Hugging Face's) into its forward, so that a
    compiled block traces it: its forward graph then computes and saves only what backward needs from it (the
    input), and backward's graph holds the recompute, fused with the backward's own ops."""
    for block in blocks:
        if checkpointed_around(block):
            block.gradient_checkpointing = False
            block.forward = _checkpointed(block.forward, None)
            block.recomputes_traced = True


def keeps_matmuls(block: nn.Module) -> bool:
    return getattr(block, "keeps_matmuls", False)


def recomputes_traced(block: nn.Module) -> bool:
    return getattr(block, "recomputes_traced", False)


def traces_checkpoint(block: nn.Module) -> bool:
    """The block's checkpoint is inside its forward (ours), not around its call (Hugging Face's)."""
    return keeps_matmuls(block) or recomputes_traced(block)


def checkpointed_around(block: nn.Module) -> bool:
    """Hugging Face's checkpoint is on, around the block's call (none of ours inside its forward)."""
    return bool(getattr(block, "gradient_checkpointing", False)) and not traces_checkpoint(block)


def checkpointed_whole(block: nn.Module) -> bool:
    """The block's whole forward runs again in backward (Hugging Face's checkpoint, or ours traced)."""
    return bool(getattr(block, "gradient_checkpointing", False)) or recomputes_traced(block)


def recomputed_share(blocks: nn.ModuleList) -> float:
    """The share of blocks whose matmuls run again in backward (the FLOPs counted for HFU)."""
    return sum(checkpointed_whole(b) for b in blocks) / len(blocks)
