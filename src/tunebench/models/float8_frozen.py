"""float8 matmuls for a frozen base (LoRA's bf16 weights, QLoRA's 4-bit ones), rowwise scaled.

A frozen linear layer needs two products a step: y = x Wᵀ forward, dx = dy W backward (no weight gradient).
Each runs as one float8 (e4m3) matmul, accumulated in fp32 and written in bf16 (`torch._scaled_mm`): x is cast
with a scale per token, W with a scale per output row. Backward casts dy per token and W per input column, stored
transposed (the matmul wants its second operand column-major), by compiled ops that inductor fuses. A 4-bit
weight is cast straight from its bytes (models.nf4.float8_weight) per row in both passes, backward moving W's row
factors onto dy's columns before casting dy (dy W = (dy diag(w_inv)) W8), so that W8 is only transposed: a
transposed per-column cast kernel of ours ran far below the memory's bandwidth. What is cast is
fused by inductor with the ops around it in the compiled block. The adapters stay in bf16.

The seven frozen linears of a block, both products with their casts, run faster than in bf16 on float8 tensor
cores (`benchmarks/compare/kernels_vs.py --ops base_fp8`). The rounding is float8's (3 mantissa bits: a few percent
relative error on a product, as tests/test_float8_frozen.py bounds it), what float8 training accepts.

The autograd functions keep nothing for backward but the weight they were given (a parameter, or for QLoRA the
packed 4-bit weight and its constants), never an activation. Not inside a compiled block's traced checkpoint
(engine.recompute.recompute_traced): torch 2.11's partitioner (the GPU image's) does not mark what runs inside an
autograd function for recompute, and kept what it returns (every block's, through the whole forward).
There the product is `recomputed_product`: the casts as plain ops and the float8 matmul one custom op with its
own gradient, which the checkpoint marks like any op; backward's graph then casts a 4-bit weight once for the
recomputed forward and the input gradient both (its three casts a step become two).

Off CUDA (tests) the float8 product is computed from the same float8 values in fp32, as `_scaled_mm` computes
it; `emulated` asks for that path on a GPU too, to compare the two."""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max
TINY = 1e-12  # a row of zeros scales as if its largest value were this


def rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` (2-D) in e4m3 with one scale per row, and the factor per row (fp32, rows x 1) that undoes it."""
    amax = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=TINY)
    scale = E4M3_MAX / amax
    return (t.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale.reciprocal()


def columnwise_transposed(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` (out x in) scaled per input column, stored transposed (in x out, row-major), and the factor per column."""
    amax = w.abs().amax(dim=0, keepdim=True).float().clamp(min=TINY)
    scale = E4M3_MAX / amax
    w8 = (w.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return w8.t().contiguous(), scale.reciprocal().t()


def _mm(a8: torch.Tensor, a_inv: torch.Tensor, bt8: torch.Tensor, b_inv: torch.Tensor, dtype: torch.dtype,
        emulated: bool) -> torch.Tensor:
    """a (m x k) times bᵀ where bt8 is b (n x k) row-major: the float8 product, fp32 accumulation, in `dtype`."""
    if a8.is_cuda and not emulated:
        return torch._scaled_mm(a8, bt8.t(), scale_a=a_inv, scale_b=b_inv.t(), out_dtype=dtype)
    return ((a8.float() @ bt8.float().t()) * a_inv * b_inv.t()).to(dtype)


def product(a: torch.Tensor, b8: torch.Tensor, b_inv: torch.Tensor, emulated: bool = False,
            dtype: torch.dtype | None = None) -> torch.Tensor:
    """a Bᵀ (a: ... x k) for B given in e4m3 (n x k, row-major) with its factor per row: `a` cast per token; the
    result in `dtype` (a's by default)."""
    a8, a_inv = rowwise(a.reshape(-1, a.shape[-1]))
    return _mm(a8, a_inv, b8, b_inv, dtype or a.dtype, emulated).view(*a.shape[:-1], b8.shape[0])


def forward_product(x: torch.Tensor, w: torch.Tensor, emulated: bool = False) -> torch.Tensor:
    """x Wᵀ (x: ... x in, W: out x in) in float8, per token and per output row."""
    return product(x, *rowwise(w), emulated=emulated)


def input_grad(grad: torch.Tensor, w: torch.Tensor, emulated: bool = False) -> torch.Tensor:
    """dy W (dy: ... x out) in float8, W cast per input column by compiled ops that write it transposed (for a
    bf16 weight inductor's kernel for that is fast: a LoRA step runs faster this way than casting W per row again and
    moving its factors onto dy, as input_grad_of_rows does for 4-bit weights)."""
    return product(grad, *columnwise_transposed(w), emulated=emulated)


def input_grad_of_rows(grad: torch.Tensor, w8: torch.Tensor, w_inv: torch.Tensor,
                       emulated: bool = False) -> torch.Tensor:
    """dy W for W given as the forward has it (e4m3 scaled per output row, `w_inv` undoing it): the row factors
    move onto dy's columns (dy W = (dy diag(w_inv)) W8), and W8 is only transposed, never scaled again."""
    wt8 = w8.t().contiguous()  # the matmul wants its second operand column-major
    ones = torch.ones(wt8.shape[0], 1, device=w8.device, dtype=torch.float32)
    return product(grad.float() * w_inv.t(), wt8, ones, emulated=emulated, dtype=grad.dtype)


class _FrozenLinear(torch.autograd.Function):
    """x Wᵀ of a frozen weight in float8 both ways; keeps only the weight (a parameter) for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, emulated: bool) -> torch.Tensor:
        ctx.save_for_backward(weight)
        ctx.emulated = emulated
        return forward_product(x, weight.to(x.dtype), emulated)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (weight,) = ctx.saved_tensors
        dx = input_grad(grad, weight.to(grad.dtype), ctx.emulated) if ctx.needs_input_grad[0] else None
        return dx, None, None


@torch.library.custom_op("tunebench::float8_product", mutates_args=())
def _float8_product(x: torch.Tensor, x8: torch.Tensor, x_inv: torch.Tensor, w8: torch.Tensor, w_inv: torch.Tensor,
                    weight: torch.Tensor | None, emulated: bool) -> torch.Tensor:
    """x Wᵀ from x8 (x cast per token) and w8; `x` (2-D) only for its gradient. Backward: W cast per input column
    from `weight` (a bf16 base) when given, else w8's rows with their factors moved onto dy (input_grad_of_rows)."""
    return _mm(x8, x_inv, w8, w_inv, x.dtype, emulated)


@_float8_product.register_fake
def _(x, x8, x_inv, w8, w_inv, weight, emulated):
    return x8.new_empty(x8.shape[0], w8.shape[0], dtype=x.dtype)


def _keep_weight(ctx, inputs, output) -> None:
    _, _, _, w8, w_inv, weight, ctx.emulated = inputs
    ctx.save_for_backward(w8, w_inv, weight)


def _product_grad(ctx, grad: torch.Tensor):
    w8, w_inv, weight = ctx.saved_tensors
    if weight is not None:
        dx = input_grad(grad, weight.to(grad.dtype), ctx.emulated)
    else:
        dx = input_grad_of_rows(grad, w8, w_inv, ctx.emulated)
    return dx, None, None, None, None, None, None


_float8_product.register_autograd(_product_grad, setup_context=_keep_weight)


def recomputed_product(x: torch.Tensor, w8: torch.Tensor, w_inv: torch.Tensor, weight: torch.Tensor | None = None,
                       emulated: bool = False) -> torch.Tensor:
    """x Wᵀ (W given in e4m3 per output row) in a block whose compiled checkpoint recomputes it: what the
    checkpoint marks for recompute, unlike the autograd functions (see the module's note). `weight`: W in bf16,
    cast per column for backward (a LoRA base); None: backward from w8 (a 4-bit base)."""
    x2 = x.reshape(-1, x.shape[-1])
    x8, x_inv = rowwise(x2.detach())
    return _float8_product(x2, x8, x_inv, w8, w_inv, weight, emulated).view(*x.shape[:-1], w8.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, emulated: bool = False,
           recomputed: bool = False) -> torch.Tensor:
    """F.linear of a frozen weight in float8 (a bias added in the output's dtype). Under autocast the input is
    cast to autocast's dtype first, as F.linear's would be. `recomputed`: in a block whose compiled checkpoint
    recomputes it (recomputed_product)."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        x = x.to(torch.get_autocast_dtype(kind))
    if recomputed:
        y = recomputed_product(x, *rowwise(weight.to(x.dtype)), weight=weight, emulated=emulated)
    else:
        y = _FrozenLinear.apply(x, weight, emulated)
    return y if bias is None else y + bias.to(y.dtype)


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, self.weight, self.bias, recomputed=self.recomputed)


def takes(layer: nn.Module) -> bool:
    """A layer float8's matmuls take: an nn.Linear (not GPT-2's Conv1D) with sides multiples of 16."""
    return type(layer) is nn.Linear and layer.in_features % 16 == 0 and layer.out_features % 16 == 0


def frozen_linears(blocks: list[nn.Module], head: nn.Module | None = None) -> list[nn.Linear]:
    """The frozen layers under LoRA adapters (peft's base layers) of the blocks that float8 takes: not the head,
    even if adapted, and not a layer that trains."""
    return [m.base_layer for b in blocks for m in b.modules()
            if takes(getattr(m, "base_layer", None)) and m is not head and m.base_layer is not head
            and not m.base_layer.weight.requires_grad]


def to_float8_frozen(blocks: list[nn.Module], head: nn.Module | None = None,
                     recomputed: Callable[[nn.Module], bool] = lambda block: False) -> int:
    """Route the frozen base layers of a LoRA model's blocks through float8 products; returns how many.
    `recomputed(block)`: the block's compiled checkpoint recomputes it (recomputed_product)."""
    count = 0
    for block in blocks:
        for m in frozen_linears([block], head):
            m.forward = types.MethodType(_forward, m)
            m.recomputed = recomputed(block)
            count += 1
    return count
