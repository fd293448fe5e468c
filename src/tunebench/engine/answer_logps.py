"""The answers' log-probabilities: each answer's sum of its tokens' log-softmax at the label, under the model's head.

Only the answers' tokens go through the head, chunk by chunk (no (tokens x vocab) logits at once). With the head
frozen (LoRA, QLoRA) each chunk's d logp / d h is computed in forward and only scaled in backward by its pair's
weight, as engine.loss does for SFT: no logits are kept or computed twice. A trained head (full fine-tuning) computes
the log-probabilities alone in forward and, its tokens' weights known in backward, the fused loss's pass there
(engine.loss.head_pass).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tunebench.engine.loss import (
    IGNORE,
    _capped,
    _compute_dtype,
    _padded,
    chunk_tokens,
    head_nll,
    head_pass,
    is_fusable,
    token_ce_pure,
)


class AnswerLogps(NamedTuple):
    """Every answer's summed token log-probabilities and its token count: (2B, K) each, chosen rows first."""

    sums: torch.Tensor
    counts: torch.Tensor


@functools.cache
def _token_ce_compiled() -> Callable:
    return torch.compile(token_ce_pure)


def _token_ce(logits: torch.Tensor, y: torch.Tensor, vocab: int, dtype: torch.dtype,
              softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.is_cuda:
        torch._dynamo.maybe_mark_dynamic(logits, 0)  # chunks' row counts vary: one graph for all of them
        return _token_ce_compiled()(logits, y, vocab, dtype, softcap)
    return token_ce_pure(logits, y, vocab, dtype, softcap)


def _frozen_head(h, weight, bias, labels, chunk: int, dtype: torch.dtype, softcap: float | None,
                 grads: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each token's log p(y_t | h_t) under a frozen head and (`grads`) its d ce / d h, chunk by chunk, without
    autograd. `grads` False: the same kernels' log-probabilities (the reference run through the policy's graph)."""
    with torch.no_grad(), torch.autocast(h.device.type, enabled=False):
        w, b = _padded(weight.to(dtype)), None if bias is None else _padded(bias.to(dtype))
        hc = h.to(dtype)
        out = torch.empty(hc.shape[0], device=h.device, dtype=torch.float32)
        grad_h = torch.empty_like(hc) if grads else None
        for i in range(0, hc.shape[0], chunk):
            ce, g = _token_ce(F.linear(hc[i:i + chunk], w, b), labels[i:i + chunk], weight.shape[0], dtype, softcap)
            out[i:i + chunk] = -ce
            if grad_h is not None:
                grad_h[i:i + chunk] = g @ w  # d ce / d h; d logp / d h is its negative
    return out, grad_h


class _FrozenHeadLogps(torch.autograd.Function):
    """log p(y_t | h_t) for each token under a frozen head; d/dh computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, h, weight, bias, labels, chunk: int, dtype: torch.dtype, softcap: float | None):
        out, grad_h = _frozen_head(h, weight, bias, labels, chunk, dtype, softcap)
        ctx.save_for_backward(grad_h)
        ctx.h_dtype = h.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (grad_h,) = ctx.saved_tensors
        return (grad_h.float() * -grad_out[:, None]).to(ctx.h_dtype), None, None, None, None, None, None


class _TrainedHeadLogps(torch.autograd.Function):
    """log p(y_t | h_t) for each token under a head that trains (full fine-tuning). Forward: the log-probabilities
    alone. Backward: with each token's weight known (the loss's d/d log p), the fused loss's pass over the head
    (engine.loss) makes d/dh and the head's gradient from the logits computed once more, as activation checkpointing
    of the chunks would, but with the softmax compiled and the head's gradient in one fp32 accumulator."""

    @staticmethod
    def forward(ctx, h, weight, bias, labels, chunk: int, dtype: torch.dtype, softcap: float | None):
        ctx.save_for_backward(h, weight, bias, labels)
        ctx.settings = (chunk, dtype, softcap)
        return -head_nll(h, weight, bias, labels, chunk, dtype, softcap)

    @staticmethod
    def backward(ctx, grad_out):
        h, weight, bias, labels = ctx.saved_tensors
        chunk, dtype, softcap = ctx.settings
        vocab = weight.shape[0]
        with torch.autocast(h.device.type, enabled=False):
            _, gh, gw, gb = head_pass(h, weight, bias, labels, chunk, dtype, softcap=softcap,
                                      weights=-grad_out.float())
        return (None if gh is None else gh.to(h.dtype), _own(gw, vocab, weight.dtype), _own(gb, vocab, bias.dtype)
                if gb is not None else None, None, None, None, None)


def _own(grad: torch.Tensor | None, rows: int, dtype: torch.dtype) -> torch.Tensor | None:
    """A gradient's first `rows` rows in `dtype`, in storage of its own: autograd adds a tied weight's second gradient
    (the embedding's) into the first in place only where nothing else shares the first's storage (a view of the
    padded buffer does), and otherwise allocates the sum beside both."""
    if grad is None:
        return None
    if grad.shape[0] != rows:
        grad = grad[:rows].clone() if grad.dtype == dtype else grad[:rows]
    return grad.to(dtype)


def _chunk_logps(head: nn.Module, h: torch.Tensor, y: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return -F.cross_entropy(_capped(head(h).float(), softcap), y, reduction="none")


def token_logps(h: torch.Tensor, head: nn.Module, y: torch.Tensor, vocab_size: int, fuse: bool = True,
                softcap: float | None = None, reference: bool = False) -> torch.Tensor:
    """Each row of `h` (tokens x hidden)'s log-probability of its label `y` under `head`, in fp32. `reference`: no
    gradient is wanted from a forward run with them on (the reference through the policy's graph): the policy's
    kernels without its d/dh."""
    n = chunk_tokens(vocab_size)
    if fuse and is_fusable(head):
        frozen = not any(p.requires_grad for p in head.parameters())
        if torch.is_grad_enabled() and h.requires_grad and frozen:
            if reference:
                return _frozen_head(h, head.weight, head.bias, y, n, _compute_dtype(h), softcap, grads=False)[0]
            return _FrozenHeadLogps.apply(h, head.weight, head.bias, y, n, _compute_dtype(h), softcap)
        if not torch.is_grad_enabled() or not h.requires_grad and frozen:
            return -head_nll(h, head.weight, head.bias, y, n, _compute_dtype(h), softcap)
        return _TrainedHeadLogps.apply(h, head.weight, head.bias, y, n, _compute_dtype(h), softcap)
    if not torch.is_grad_enabled():
        return torch.cat([_chunk_logps(head, h[i:i + n], y[i:i + n], softcap) for i in range(0, h.shape[0], n)]) \
            if h.shape[0] else h.new_zeros(0, dtype=torch.float32)
    parts = [checkpoint(_chunk_logps, head, h[i:i + n], y[i:i + n], softcap, use_reentrant=False)
             for i in range(0, h.shape[0], n)]
    return torch.cat(parts) if parts else h.new_zeros(0, dtype=torch.float32)


def _answer_sums(values: torch.Tensor, slot: torch.Tensor, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each slot's sum of `values` and their count, `slot` ascending (an answer's tokens are contiguous). Summed as
    differences of an fp64 running sum: the same bits on every run (index_add's atomic adds on a GPU sum in
    whatever order the threads arrive, an answer's sum moving by its last bits from one run to the next)."""
    ends = torch.zeros(slots, dtype=torch.long, device=values.device).index_add_(0, slot, torch.ones_like(slot))
    ends = ends.cumsum(0)
    running = F.pad(values.double().cumsum(0), (1, 0))
    starts = F.pad(ends, (1, 0))[:-1]
    return (running[ends] - running[starts]).float(), (ends - starts).float()


def answer_logps(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, positions: torch.Tensor | None,
                 per_row: int, vocab_size: int, fuse: bool = True, softcap: float | None = None,
                 reference: bool = False) -> AnswerLogps:
    """Sum and count of each answer's token log-probabilities: (rows, per_row) each. Only the labelled tokens go
    through the head (their count is read from the device: the one host sync of the step). `reference`: as for
    token_logps."""
    rows, seq = labels.shape
    flat = labels.reshape(-1)
    picked = (flat != IGNORE).nonzero().squeeze(1)
    slot = picked // seq * per_row
    if positions is not None and per_row > 1:
        example = ((positions == 0).cumsum(1) - 1).clamp(min=0).reshape(-1)  # which example of its row
        slot = slot + example[picked].clamp(max=per_row - 1)
    h = hidden.reshape(-1, hidden.shape[-1])[picked]
    logp = token_logps(h, head, flat[picked], vocab_size, fuse, softcap, reference)
    sums, counts = _answer_sums(logp, slot, rows * per_row)
    return AnswerLogps(sums.view(rows, per_row), counts.view(rows, per_row))
