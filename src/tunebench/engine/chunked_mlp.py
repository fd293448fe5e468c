"""A block's MLP run on a chunk of tokens at a time, keeping only its input for backward (`mlp_chunk`).

At long context the MLP's intermediates are the largest tensors a block makes: gate, up, their product and, in
backward, their gradients, each `intermediate_size` wide per token (14,336 where the hidden size is 4,096 on
Llama-3-8B). A dense MLP acts on every token alone, so its forward and backward can run on a slice of the tokens at
a time: forward runs each slice without autograd and keeps only the MLP's input; backward runs each slice's forward
again with autograd and its backward at once, accumulating the input's and the trainable weights' gradients. What a
block holds for its MLP is then one slice's intermediates, whatever the sequence length, for one more MLP forward
per step (as Arctic's TiledMLP and Unsloth's long-context training do).

The weights are inputs of the autograd function, so their gradients reach autograd once per step, summed over the
slices (DDP's hooks see one gradient). The MLP runs outside torch.compile (its backward calls autograd itself);
the rest of a compiled block stays compiled.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class _Chunked(torch.autograd.Function):
    """y = mlp(x) slice by slice; `weights` (the MLP's trainable parameters) are inputs so that their gradients
    come out of this function's backward."""

    @staticmethod
    def forward(ctx, mlp: Callable[[torch.Tensor], torch.Tensor], chunk: int, x: torch.Tensor,
                *weights: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        ctx.mlp, ctx.chunk, ctx.weights = mlp, chunk, weights  # parameters: held by the module, not activations
        ctx.autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        ctx.rng = _rng_state(x.device)  # dropout inside the MLP draws the same masks when backward runs it again
        ctx.save_for_backward(x)
        return _forward_in_chunks(mlp, chunk, x)  # autograd is off inside an autograd function's forward

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        weights = list(ctx.weights)
        tokens, grads = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        dx = torch.empty_like(tokens) if ctx.needs_input_grad[2] else None
        dw: list[torch.Tensor | None] = [None] * len(weights)
        enabled, dtype = ctx.autocast
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
            _set_rng_state(x.device, ctx.rng)
            for start in range(0, tokens.shape[0], ctx.chunk):
                part = tokens[start:start + ctx.chunk].detach().requires_grad_(dx is not None)
                with torch.enable_grad(), torch.autocast(x.device.type, dtype=dtype, enabled=enabled):
                    out = ctx.mlp(part)
                inputs = ([part] if dx is not None else []) + weights
                got = list(torch.autograd.grad(out, inputs, grads[start:start + part.shape[0]], allow_unused=True))
                if dx is not None:
                    dx[start:start + part.shape[0]] = got.pop(0)
                for k, g in enumerate(got):
                    if g is not None:  # summed in fp32, rounded once (16-bit weights under bf16-pure)
                        dw[k] = g.float() if dw[k] is None else dw[k].add_(g)
        dw = [g if g is None else g.to(w.dtype) for g, w in zip(dw, weights)]
        return (None, None, None if dx is None else dx.view_as(x), *dw)


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(device: torch.device, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _forward_in_chunks(mlp: Callable[[torch.Tensor], torch.Tensor], chunk: int, x: torch.Tensor) -> torch.Tensor:
    """The slices' outputs, written into one tensor (no autograd: nothing is kept)."""
    tokens = x.reshape(-1, x.shape[-1])
    out = None
    for start in range(0, tokens.shape[0], chunk):
        part = mlp(tokens[start:start + chunk])
        if out is None:  # the output's dtype is the MLP's (autocast's), known from the first slice
            out = part.new_empty((tokens.shape[0], part.shape[-1]))
        out[start:start + part.shape[0]] = part
    return out.view(*x.shape[:-1], out.shape[-1])


def run_chunked(mlp: Callable[[torch.Tensor], torch.Tensor], chunk: int, x: torch.Tensor,
                weights: list[torch.Tensor]) -> torch.Tensor:
    """mlp(x), `chunk` tokens at a time, keeping only `x` for backward; `weights`: the MLP's trainable parameters."""
    if not torch.is_grad_enabled() or not (x.requires_grad or any(w.requires_grad for w in weights)):
        with torch.no_grad():  # evaluation, a frozen reference
            return _forward_in_chunks(mlp, chunk, x)
    return _Chunked.apply(mlp, chunk, x, *weights)


def is_dense_mlp(module: nn.Module) -> bool:
    """A block's MLP that acts on each token alone: not a mixture of experts (whose routing balances over the
    batch's tokens and whose auxiliary loss reads them all)."""
    return not any(hasattr(module, name) for name in ("router", "gate_logits")) and \
        not any(hasattr(m, "experts") for m in module.modules())


def chunk_mlps(blocks: list[nn.Module], chunk: int) -> int:
    """Run each block's dense MLP (`block.mlp`) `chunk` tokens at a time; returns how many MLPs were changed."""
    changed = 0
    for block in blocks:
        mlp = getattr(block, "mlp", None)
        if mlp is None or not is_dense_mlp(mlp) or getattr(mlp, "mlp_chunk", None):
            continue
        inner = mlp.forward
        params = list(mlp.parameters())

        @torch.compiler.disable  # its backward runs autograd itself: dynamo cannot trace it
        def forward(x: torch.Tensor, _inner=inner, _params=params) -> torch.Tensor:
            return run_chunked(_inner, chunk, x, [p for p in _params if p.requires_grad])  # as trained now

        mlp.forward, mlp.mlp_chunk = forward, chunk
        changed += 1
    return changed
