"""Causal-LM loss fused with the output head, computed in chunks of tokens.

Hugging Face's loss materialises the whole (tokens x vocab) logits and upcasts them to fp32: on
Mistral-7B at batch 8 x 512 that is 0.8 GiB, plus as much again for its gradient. Here the head's
matmul, the softmax cross-entropy and both gradients are done one chunk of tokens at a time in the
forward pass (the approach of Liger's fused linear cross-entropy, in plain PyTorch): only one
chunk of fp32 logits lives at a time and nothing is recomputed in backward, which only scales the
stored gradients by the incoming one.

A head that is not a plain ``nn.Linear`` (a LoRA-wrapped head, say) falls back to chunks whose
logits are recomputed in backward by activation checkpointing; HFU counts that recompute.

A model that soft-caps its output (Gemma 2: logits = c * tanh(z / c)) gets the cap inside each chunk, and its
derivative 1 - tanh^2 in the chunk's gradient, as the model's own head computes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

LOGITS_PER_CHUNK = 1 << 26  # fp32 elements: 256 MiB
# evaluation's chunks: its logits, their fp32 copy and log-sum-exp's exponentials are all it holds, beside a train
# job's CUDA graph pools (which keep the step's activations): an eighth (32 MiB, 262 tokens at a 32,000 vocabulary,
# never below 128) lowers such a job's peak (its evaluation's buffers sit on top of those pools), and leaves the
# head's matmuls deep enough that evaluation, a few batches now and then, is no slower for it
EVAL_CHUNK_FRACTION = 8
IGNORE = -100  # a label that is not trained on (prompt tokens, padding, the last token of an example)


ALIGN = 64  # rows of the head the loss's matmuls see: a multiple of this
GRAD_GROUP = 3  # chunks per matmul of a trained head's gradient: 3 keep the loss's peak where it was


def chunk_tokens(vocab_size: int) -> int:
    return max(128, LOGITS_PER_CHUNK // vocab_size)


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    return torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else h.dtype


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """sum over tokens of CE(h @ W.T + b, y), with d/dh, d/dW, d/db computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, h, weight, bias, labels, chunk: int, dtype: torch.dtype, masked: bool = False,
                softcap: float | None = None):
        with torch.autocast(h.device.type, enabled=False):  # dtypes are chosen explicitly below
            return _FusedLinearCrossEntropy._forward(ctx, h, weight, bias, labels, chunk, dtype, masked, softcap)

    @staticmethod
    def _forward(ctx, h, weight, bias, labels, chunk: int, dtype: torch.dtype, masked: bool,
                 softcap: float | None):
        vocab = weight.shape[0]
        total, grad_h, grad_w, grad_b = head_pass(h, weight, bias, labels, chunk, dtype, masked, softcap)
        ctx.save_for_backward(grad_h, None if grad_w is None else grad_w[:vocab],
                              None if grad_b is None else grad_b[:vocab])
        ctx.dtypes = (h.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        hd, wd, bd = ctx.dtypes
        gh = None if grad_h is None else (grad_h * grad_out.to(grad_h.dtype)).to(hd)
        gw = None if grad_w is None else (grad_w * grad_out).to(wd)
        gb = None if grad_b is None else (grad_b * grad_out).to(bd)
        return gh, gw, gb, None, None, None, None, None


def head_pass(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, chunk: int,
              dtype: torch.dtype, masked: bool = False, softcap: float | None = None,
              weights: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """The fused loss's pass over the head, chunk by chunk: (sum over tokens of weights x CE(h @ W.T + b, y), its
    d/dh, d/dW in fp32 and d/db over the head's padded rows), each gradient only where its input requires one.
    `weights`: each token's multiplier (1 where None); SFT's loss takes 1, a preference loss its d loss / d log p."""
    vocab = weight.shape[0]
    w, b = _padded(weight.to(dtype)), None if bias is None else _padded(bias.to(dtype))
    hc = h.to(dtype)
    # Traced (a whole model's graph), no buffer is filled in place by its slices: torch 2.11's dynamo saved for
    # backward what a tensor held before such writes (all-zero gradients; tests/test_loss.py holds it to eager's).
    # The head's gradient is the exception: one opaque op writes it in place (_accumulate_in_graph).
    traced = torch.compiler.is_compiling()
    grad_h = torch.empty_like(hc) if h.requires_grad and not traced else None
    grads_h: list[torch.Tensor] = []  # traced: each group's, joined at the end
    grad_w = torch.zeros_like(w, dtype=torch.float32) if weight.requires_grad else None
    grad_b = torch.zeros_like(b, dtype=torch.float32) if bias is not None and bias.requires_grad else None
    total = torch.zeros((), device=h.device, dtype=torch.float32)
    # a trained head's gradient takes one matmul per GRAD_GROUP chunks: each pass over its fp32 accumulator
    # costs about what the product does at one chunk's width, so a pass per chunk would cost as much again
    span = chunk * GRAD_GROUP if grad_w is not None else chunk
    for i in range(0, hc.shape[0], span):
        rows = hc[i:i + span]
        # d loss / d logits in the compute dtype: one chunk's, or a group's gathered (eagerly into one buffer,
        # each chunk's freed before the next chunk's logits exist)
        g_rows = torch.empty((rows.shape[0], w.shape[0]), device=h.device, dtype=dtype) if (
            span > chunk and not traced) else None
        parts = []
        for j in range(0, rows.shape[0], chunk):
            x, y = rows[j:j + chunk], labels[i + j:i + j + chunk]
            valid = None if weights is None else weights[i + j:i + j + chunk]
            if masked:  # tokens labelled IGNORE add nothing to the loss and get no gradient
                kept = y != IGNORE
                valid = kept if valid is None else valid * kept
                y = torch.where(kept, y, 0)
            part, g = _loss_and_grad(F.linear(x, w, b), y, vocab, valid, dtype, softcap)
            total = total + part if traced else total.add_(part)
            if g_rows is None:
                parts.append(g)
            else:
                g_rows[j:j + chunk] = g
                del g
        if g_rows is None:
            g_rows = parts[0] if len(parts) == 1 else torch.cat(parts)
        del parts
        if traced and h.requires_grad:
            grads_h.append(g_rows @ w)
        elif grad_h is not None:
            grad_h[i:i + span] = g_rows @ w
        if grad_w is not None:
            (_accumulate_in_graph if traced else _accumulate)(grad_w, g_rows.t(), rows)
        if grad_b is not None:
            group_b = g_rows.sum(0, dtype=torch.float32)
            grad_b = grad_b + group_b if traced else grad_b.add_(group_b)
    if grads_h:
        grad_h = torch.cat(grads_h)
    return total, grad_h, grad_w, grad_b


def _loss_and_grad_eager(logits: torch.Tensor, y: torch.Tensor, vocab: int, valid: torch.Tensor | None,
                         dtype: torch.dtype, softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the chunk's cross-entropies, d(that sum)/d logits in `dtype`) = softmax - onehot, computed in place
    over one fp32 copy of the logits (times 1 - tanh^2 under a soft cap)."""
    logits = logits.float()
    capped = None
    if softcap is not None:
        capped = logits.div_(softcap).tanh_()
        logits = capped * softcap
    if logits.shape[1] > vocab:
        logits[:, vocab:] = -torch.inf  # the padding's columns: no probability, so no gradient either
    lse = torch.logsumexp(logits, dim=-1)
    per_token = lse - logits.gather(1, y[:, None]).squeeze(1)
    total = (per_token * valid).sum() if valid is not None else per_token.sum()
    g = logits.sub_(lse[:, None]).exp_()
    g[torch.arange(y.shape[0], device=y.device), y] -= 1.0
    if valid is not None:
        g.mul_(valid[:, None])
    if capped is not None:
        g.mul_(1.0 - capped.square_())
    return total, g.to(dtype)


def token_ce_pure(logits: torch.Tensor, y: torch.Tensor, vocab: int, dtype: torch.dtype,
                  softcap: float | None = None, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's cross-entropy in fp32 and d(ce)/d logits = softmax - onehot in `dtype` (tokens where `valid` is 0
    count for nothing), written without in-place ops for inductor: one reduction and one pointwise kernel that read
    the 16-bit logits and write the 16-bit gradient, the fp32 logits never stored. The SFT loss sums it; the
    preference losses (engine.preference) take it token by token."""
    z = logits.float()
    capped = None
    if softcap is not None:
        capped = torch.tanh(z / softcap)
        z = capped * softcap
    columns = torch.arange(z.shape[1], device=z.device)
    if z.shape[1] > vocab:
        z = z.masked_fill(columns >= vocab, -torch.inf)  # the padded head's columns: no probability
    lse = torch.logsumexp(z, dim=-1)
    per_token = lse - z.gather(1, y[:, None]).squeeze(1)
    g = (z - lse[:, None]).exp() - (columns == y[:, None]).to(z.dtype)
    if valid is not None:
        per_token, g = per_token * valid, g * valid[:, None]
    if capped is not None:
        g = g * (1.0 - capped * capped)
    return per_token, g.to(dtype)


def _loss_and_grad_pure(logits: torch.Tensor, y: torch.Tensor, vocab: int, valid: torch.Tensor | None,
                        dtype: torch.dtype, softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as the in-place form, for inductor: the tokens' cross-entropies summed."""
    per_token, g = token_ce_pure(logits, y, vocab, dtype, softcap, valid)
    return per_token.sum(), g


@functools.cache
def _compiled() -> Callable:
    return torch.compile(_loss_and_grad_pure)  # on first use: importing dynamo is slow


def _loss_and_grad(logits: torch.Tensor, y: torch.Tensor, vocab: int, valid: torch.Tensor | None,
                   dtype: torch.dtype, softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eagerly on a GPU, the softmax's passes over a chunk's fp32 logits (cast, logsumexp, subtract, exp, cast
    back: each a pass over memory, for every chunk of every step) are one compiled pair of kernels; elsewhere (the
    CPU) the in-place form runs. Inside a compiled graph (a whole model's) the pure form is traced: the in-place one
    kept up to four chunks' fp32 logits alive there, more memory for no speed (benchmarks/results/full-finetune.md)."""
    if torch.compiler.is_compiling():
        return _loss_and_grad_pure(logits, y, vocab, valid, dtype, softcap)
    if logits.is_cuda:
        # chunks' row counts vary (the last one is partial): one graph for all, not one per count (dynamo stops
        # compiling after 8 and would run the pure form eagerly, with its fp32 temporaries)
        torch._dynamo.maybe_mark_dynamic(logits, 0)
        return _compiled()(logits, y, vocab, valid, dtype, softcap)
    return _loss_and_grad_eager(logits, y, vocab, valid, dtype, softcap)


def _padded(t: torch.Tensor) -> torch.Tensor:
    """The head's rows padded with zeros to a multiple of ALIGN. With an odd vocabulary (GPT-2's 50,257)
    every matmul of the loss has a row stride no Hopper kernel takes, and cuBLAS falls back to slow
    1-element-aligned kernels (a large share of an eager GPT-2 step). Aligned vocabularies are left as
    they are (no copy)."""
    rows = t.shape[0]
    if rows % ALIGN == 0:
        return t
    out = t.new_zeros((rows + ALIGN - rows % ALIGN, *t.shape[1:]))
    out[:rows] = t
    return out


# CUDA's addmm writes a bf16 product straight into an fp32 accumulator (cuBLAS, fp32 epilogue); elsewhere the
# product is made in the inputs' dtype and then added. The latter costs a 16-bit copy of the head's gradient per
# chunk and an extra pass over the fp32 one, for every chunk of every step.
_FP32_EPILOGUE = hasattr(torch.ops.aten.addmm, "dtype_out")


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc += a @ b in place (eagerly: traced, the loss accumulates without mutation), acc fp32 and a, b 16-bit;
    returns acc."""
    if acc.device.type == "cuda" and _FP32_EPILOGUE and a.dtype != acc.dtype:
        return torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    return acc.add_(a @ b)


@torch.library.custom_op("tunebench::accumulate_matmul", mutates_args=("acc",))
def _accumulate_in_graph(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """`_accumulate` as one opaque op of a compiled graph, written in place into the accumulator. Summed out of place
    (`acc + a @ b`), inductor fused every group's sum into one kernel at the loss's end and kept each group's 16-bit
    product (as large as the head's gradient) alive until then, all of them at once at the loss's peak."""
    _accumulate(acc, a, b)


@_accumulate_in_graph.register_fake
def _(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    return None


def _loss_only(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, chunk: int,
               dtype: torch.dtype, masked: bool, softcap: float | None = None) -> torch.Tensor:
    """sum over tokens of CE(h @ W.T + b, y) where no gradient is wanted (evaluation): chunk by chunk, each chunk's
    logits and their log-sum-exp alone. The fused function computes the gradients whatever the grad mode (autograd
    runs its forward without it): a train job evaluating beside its CUDA graphs' pools would hold the logits' and
    the head's gradient buffers on top of them, a peak above its step's own (benchmarks/results/training-jobs.md)."""
    per_token = head_nll(h, weight, bias, labels.clamp(min=0), chunk, dtype, softcap)
    return (per_token * (labels != IGNORE) if masked else per_token).sum()


def token_nll_pure(logits: torch.Tensor, y: torch.Tensor, vocab: int, softcap: float | None = None) -> torch.Tensor:
    """Each token's cross-entropy in fp32 and nothing else (no gradient wanted): one reduction over the 16-bit
    logits, the padded head's columns left out."""
    z = _capped(logits.float(), softcap)
    if z.shape[1] > vocab:
        z = z.masked_fill(torch.arange(z.shape[1], device=z.device) >= vocab, -torch.inf)
    return torch.logsumexp(z, dim=-1) - z.gather(1, y[:, None]).squeeze(1)


@functools.cache
def _nll_compiled() -> Callable:
    return torch.compile(token_nll_pure)


def token_nll(logits: torch.Tensor, y: torch.Tensor, vocab: int, softcap: float | None = None) -> torch.Tensor:
    """token_nll_pure, compiled on a GPU (eagerly: a cast to fp32 and a pass over it per step of log-sum-exp)."""
    if logits.is_cuda and not torch.compiler.is_compiling():
        torch._dynamo.maybe_mark_dynamic(logits, 0)  # chunks' row counts vary: one graph for all of them
        return _nll_compiled()(logits, y, vocab, softcap)
    return token_nll_pure(logits, y, vocab, softcap)


def head_nll(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, chunk: int,
             dtype: torch.dtype, softcap: float | None = None) -> torch.Tensor:
    """Each row of `h`'s cross-entropy of its label under the head, in fp32, without gradients: chunk by chunk, the
    head cast to `dtype` once (autocast would cast it again for every chunk)."""
    vocab = weight.shape[0]
    with torch.no_grad(), torch.autocast(h.device.type, enabled=False):
        w, b = _padded(weight.to(dtype)), None if bias is None else _padded(bias.to(dtype))
        parts = [token_nll(F.linear(h[i:i + chunk].to(dtype), w, b), labels[i:i + chunk], vocab, softcap)
                 for i in range(0, h.shape[0], chunk)]
    return torch.cat(parts) if parts else h.new_zeros(0, dtype=torch.float32)


def _capped(z: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return z if softcap is None else torch.tanh(z / softcap) * softcap


def _chunk_loss(head: nn.Module, h: torch.Tensor, labels: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
    return F.cross_entropy(_capped(head(h).float(), softcap), labels, reduction="sum", ignore_index=IGNORE)


def is_fusable(head: nn.Module) -> bool:
    return type(head) is nn.Linear


def causal_lm_loss(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, vocab_size: int,
                   fuse: bool = True, masked: bool = False, softcap: float | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy; `labels` are already shifted (labels[i] follows input[i]).

    `masked`: some labels are IGNORE (-100: prompt, padding, example boundaries) and the mean is over the
    others. Synthetic benchmark data has none, and skips the masking's extra pass over the logits.
    `softcap`: the model's final logit soft-capping (Gemma 2), None for none."""
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    n = chunk_tokens(vocab_size)
    if fuse and is_fusable(head) and not torch.is_grad_enabled():
        total = _loss_only(h, head.weight, head.bias, y, max(128, n // EVAL_CHUNK_FRACTION), _compute_dtype(h),
                           masked, softcap)
    elif fuse and is_fusable(head):
        total = _FusedLinearCrossEntropy.apply(h, head.weight, head.bias, y, n, _compute_dtype(h), masked, softcap)
    else:
        total = sum(checkpoint(_chunk_loss, head, h[i:i + n], y[i:i + n], softcap, use_reentrant=False)
                    for i in range(0, h.shape[0], n))
    return total / ((y != IGNORE).sum().clamp(min=1) if masked else y.numel())
