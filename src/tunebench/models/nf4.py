"""4-bit (NF4/FP4) linear layers whose dequantization torch.compile fuses into the block's graph.

bitsandbytes reaches the GPU from Python at every 4-bit matmul: at training sizes it dequantizes the nested
absmax (two small kernels), then the weight, then calls F.linear, each step on the host; in a compiled block
that is an opaque call. Profiled (Mistral-7B QLoRA, no checkpointing), the GPU waited on those calls for a
visible part of the step. Written in torch ops, the same dequantization (the absmax as
code2[byte] * absmax2 + offset, the weight as code[nibble] * absmax, in fp32 as bitsandbytes does, then cast) is
fused by inductor into one kernel launched from the graph with the rest of the block.

`_Linear4bit` keeps only the packed weight for backward, like bitsandbytes' own matmul: both passes dequantize
(backward through different ops, so that compiled they are not merged into one whose bf16 output is kept).
Used in compiled blocks that keep their matmuls' outputs (engine.recompute.keep_matmuls): the block's selective
checkpoint then sees the base matmuls as plain ops and keeps them as it does a bf16 base's, recomputing only the
dequantization (faster than recomputing everything, for more memory); in
compiled blocks without checkpointing (no bitsandbytes calls from the host between kernels); and, as plain ops
(`recomputed`), in compiled blocks whose whole-block checkpoint is traced (engine.recompute.recompute_traced).
Not in blocks under Hugging Face's checkpoint around their call (no faster there than bitsandbytes' layers, with
the torch ops or with the kernel). Eagerly the same ops are several kernels with large
temporaries, and FSDP2 and DeepSpeed store the weights in another dtype.

On a GPU the dequantization is one Triton kernel (models.nf4_kernel, the same values): faster than inductor's
kernel for these ops (it reads each byte once), which shows in a whole QLoRA step (benchmarks/results/qlora-lora.md).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from tunebench.models import float8_frozen, nf4_kernel

NESTED_BLOCK = 256  # bitsandbytes quantizes the absmax itself in blocks of 256 (double quantization)


def dequantize(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int,
               shape: tuple[int, ...], dtype: torch.dtype, absmax_code: torch.Tensor | None = None,
               absmax_scale: torch.Tensor | None = None, offset: torch.Tensor | None = None,
               again: bool = False) -> torch.Tensor:
    """bitsandbytes' dequantize_4bit: two 4-bit indices per byte, high nibble first, scaled per block.

    `again`: the same values through different ops, for backward. Compiled, the joint graph's common-subexpression
    pass would merge identical forward and backward dequantizations into one, which the partitioner then keeps
    for backward: the whole bf16 weight saved (without checkpointing, a bf16 copy of every 4-bit layer)."""
    absmax = block_absmax(absmax, absmax_code, absmax_scale, offset, again)
    return (code[_nibbles(packed, again)].view(-1, blocksize) * absmax.view(-1, 1)).view(shape).to(dtype)


def block_absmax(absmax: torch.Tensor, absmax_code: torch.Tensor | None = None,
                 absmax_scale: torch.Tensor | None = None, offset: torch.Tensor | None = None,
                 again: bool = False) -> torch.Tensor:
    """Each block's scale in fp32: the nested absmax (8-bit, with a scale per NESTED_BLOCK of them) dequantized."""
    if absmax_code is None:
        return absmax
    index = absmax.int() if again else absmax.long()
    return absmax_code[index] * absmax_scale.repeat_interleave(NESTED_BLOCK)[:absmax.numel()] + offset


def float8_row_scales(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, absmax_code, absmax_scale,
                      offset, blocksize: int, shape: tuple[int, int]) -> torch.Tensor:
    """Each row's scale into e4m3 (fp32): E4M3_MAX over the row's largest magnitude, as float8_frozen.rowwise finds
    it. A frozen weight's are constant: computed once (fuse_dequantization), not in every pass.

    Where blocks tile the rows (every LLM layer), from the blocks' absmax alone: a row's largest value is its largest
    block absmax times the code's largest magnitude (each block holds its absmax exactly)."""
    rows, cols = shape
    if cols % blocksize:  # blocks cross rows (tiny test models): from the weight itself
        w = dequantize(packed, absmax, code, blocksize, shape, torch.float32, absmax_code, absmax_scale, offset)
        bound = w.abs().amax(1)
    else:
        per_block = block_absmax(absmax, absmax_code, absmax_scale, offset).float()
        bound = (per_block.view(rows, cols // blocksize) * code.abs().max()).amax(1)
    return float8_frozen.E4M3_MAX / bound.clamp(min=float8_frozen.TINY)


def float8_weight(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, absmax_code, absmax_scale, offset,
                  blocksize: int, shape: tuple[int, int], scale: torch.Tensor, again: bool = False) -> torch.Tensor:
    """The weight in e4m3 for a float8 matmul (models.float8_frozen), straight from its 4 bits, each row times its
    `scale` (float8_row_scales): one Triton kernel on a GPU. `again`: through other ops (see `dequantize`)."""
    if nf4_kernel.available(packed):
        return nf4_kernel.to_float8(packed, absmax, code, absmax_code, absmax_scale, offset, scale, blocksize, shape,
                                    again)
    w = dequantize(packed, absmax, code, blocksize, shape, torch.float32, absmax_code, absmax_scale, offset,
                   again=again) * scale[:, None]
    return w.clamp(-float8_frozen.E4M3_MAX, float8_frozen.E4M3_MAX).to(float8_frozen.E4M3)


def _nibbles(packed: torch.Tensor, again: bool = False) -> torch.Tensor:
    """The 4-bit indices, two per byte, high nibble first (`again`: through other ops, see `dequantize`)."""
    b = packed.reshape(-1)
    return torch.stack((b // 16, b % 16) if again else (b >> 4, b & 0xF), dim=-1).reshape(-1).long()


def _dequantize(packed: torch.Tensor, *args, again: bool = False) -> torch.Tensor:
    """One Triton kernel on a GPU (models.nf4_kernel: the same values, faster than inductor's), else
    the torch ops."""
    fn = nf4_kernel.dequantize if nf4_kernel.available(packed) else dequantize
    return fn(packed, *args, again=again)


def _linear(x, packed, absmax, code, absmax_code, absmax_scale, offset, blocksize: int, shape, bias):
    w = _dequantize(packed, absmax, code, blocksize, shape, x.dtype, absmax_code, absmax_scale, offset)
    return F.linear(x, w, bias)


class _Linear4bit(torch.autograd.Function):
    """`scale`, `inv` (the rows' float8 scales and their inverses, rows x 1): both products in float8
    (models.float8_frozen) from the 4-bit weight cast straight to e4m3; None: in the input's dtype."""

    @staticmethod
    def forward(ctx, x, packed, absmax, code, absmax_code, absmax_scale, offset, blocksize: int, shape, bias,
                scale=None, inv=None):
        ctx.save_for_backward(packed, absmax, code, absmax_code, absmax_scale, offset, scale, inv)
        ctx.meta = (blocksize, shape, bias is not None and bias.requires_grad)
        if scale is None:
            return _linear(x, packed, absmax, code, absmax_code, absmax_scale, offset, blocksize, shape, bias)
        w8 = float8_weight(packed, absmax, code, absmax_code, absmax_scale, offset, blocksize, shape, scale)
        y = float8_frozen.product(x, w8, inv)
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx, grad):
        packed, absmax, code, absmax_code, absmax_scale, offset, scale, inv = ctx.saved_tensors
        blocksize, shape, bias_grad = ctx.meta
        grad_x = None
        if ctx.needs_input_grad[0] and scale is not None:
            w8 = float8_weight(packed, absmax, code, absmax_code, absmax_scale, offset, blocksize, shape, scale,
                               again=True)
            grad_x = float8_frozen.input_grad_of_rows(grad, w8, inv)
        elif ctx.needs_input_grad[0]:
            w = _dequantize(packed, absmax, code, blocksize, shape, grad.dtype, absmax_code, absmax_scale, offset,
                            again=True)
            grad_x = grad @ w
        grad_b = grad.reshape(-1, grad.shape[-1]).sum(0) if bias_grad else None
        return grad_x, None, None, None, None, None, None, None, None, grad_b, None, None


def _forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """bitsandbytes' Linear4bit.forward (compute dtype, bias cast, output back in the input's dtype)."""
    qs = self.weight.quant_state
    dtype = x.dtype
    if self.compute_dtype is not None:
        x = x.to(self.compute_dtype)
    bias = None if self.bias is None else self.bias.to(x.dtype)
    nested = (qs.state2.code, qs.state2.absmax, qs.offset) if qs.nested else (None, None, None)
    packed = self.weight.data  # the plain uint8 tensor, without Params4bit's subclass
    args = (packed, qs.absmax, qs.code, *nested, qs.blocksize, tuple(qs.shape))
    if self.recomputed and self.float8:  # the traced checkpoint recomputes the cast, once for both passes
        y = float8_frozen.recomputed_product(x, float8_weight(*args, self.float8_scale), self.float8_inv)
        return (y if bias is None else y + bias).to(dtype)
    if self.recomputed:  # plain ops: the traced checkpoint recomputes the dequantization in backward
        return _linear(x, *args, bias).to(dtype)
    # float8 or not, the function keeps only the packed weight (both passes dequantize it)
    float8 = (self.float8_scale, self.float8_inv) if self.float8 else ()
    return _Linear4bit.apply(x, *args, bias, *float8).to(dtype)


def fusable(module: nn.Module) -> bool:
    """A bitsandbytes 4-bit linear (not peft's LoRA layer around one) stored as uint8, its blocks tiling it whole
    (every LLM linear layer)."""
    import bitsandbytes as bnb

    if not isinstance(module, bnb.nn.Linear4bit) or getattr(module.weight, "quant_state", None) is None:
        return False
    qs, n = module.weight.quant_state, module.weight.quant_state.shape.numel()
    if module.weight.dtype != torch.uint8 or n % qs.blocksize:
        return False
    return not qs.nested or qs.state2.blocksize == NESTED_BLOCK


def all_fusable(module: nn.Module) -> bool:
    """Every 4-bit linear of `module` can run as our layers (not stored in another dtype, as FSDP2's and
    DeepSpeed's are)."""
    import bitsandbytes as bnb

    return all(fusable(m) for m in module.modules() if isinstance(m, bnb.nn.Linear4bit))


def fuse_dequantization(module: nn.Module, recomputed: bool = False, float8: bool = False) -> int:
    """Route each fusable 4-bit linear of `module` through our dequantization; returns how many were.

    `recomputed`: `module` is a block whose whole-block checkpoint a compiled graph traces
    (engine.recompute.recompute_traced). Its layers are then plain ops, dequantization and matmul (float8's:
    float8_frozen.recomputed_product), which the checkpoint marks for recompute. Not `_Linear4bit`: what runs
    inside an autograd function is not marked (torch 2.11), so the partitioner kept what that function's backward
    reads (each block's bf16 weights, through the whole forward).
    `float8`: both of a layer's products in float8 (models.float8_frozen)."""
    layers = [m for m in module.modules() if fusable(m)]
    for m in layers:
        m.forward = types.MethodType(_forward, m)
        # float8's matmuls take sides that are multiples of 16 (every LLM layer); others compute in bf16
        m.recomputed, m.float8 = recomputed, float8 and m.in_features % 16 == 0 and m.out_features % 16 == 0
        if m.float8:  # buffers: moved with the layer, never saved in a checkpoint
            qs = m.weight.quant_state
            nested = (qs.state2.code, qs.state2.absmax, qs.offset) if qs.nested else (None, None, None)
            scale = float8_row_scales(m.weight.data, qs.absmax, qs.code, *nested, qs.blocksize, tuple(qs.shape))
            m.register_buffer("float8_scale", scale, persistent=False)
            m.register_buffer("float8_inv", scale.reciprocal()[:, None], persistent=False)
    return len(layers)
