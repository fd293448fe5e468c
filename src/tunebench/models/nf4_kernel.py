"""bitsandbytes' 4-bit dequantization as one Triton kernel (CUDA only; `nf4.dequantize` is the reference).

Inductor's kernel for the torch-ops dequantization (an int64 gather per element, the nibbles stacked, the nested
absmax expanded) reads and writes far below the GPU's memory bandwidth (benchmarks/compare/dequant_vs.py). This
one reads each byte once, looks both nibbles up in the 16-entry code, scales them by their block's absmax (itself
dequantized in place when nested: `code2[byte] * absmax2 + offset`), and stores the pair interleaved, in the output
dtype. The products are rounded as bitsandbytes rounds them (fp32 multiply, then add, never fused into one fma):
the values are its values bit for bit.

Registered as a `torch.library.triton_op`, so that torch.compile sees the kernel inside a block's graph (no graph
break) and eager calls launch it directly. `again` selects a second, identical entry point: compiled, the joint
graph's common-subexpression pass would otherwise merge the forward's and backward's dequantizations into one and
keep its bf16 output for backward.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
    from torch.library import triton_op, wrap_triton  # torch >= 2.6
except ImportError:  # CPU-only installs, or an older torch: models.nf4 falls back to its torch ops
    triton = None

BYTES_PER_PROGRAM = 2048  # 4,096 output elements per program: the fastest of the sizes tried (512-4096)
NUM_WARPS = 4


def available(where: torch.Tensor | torch.device | str) -> bool:
    """For a CUDA tensor or device, with Triton installed. `TUNEBENCH_NF4_KERNEL=0` turns it off, to measure it
    against what ran before it in one job (its values are the same, so no record needs to tell them apart)."""
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    return triton is not None and device.type == "cuda" and os.environ.get("TUNEBENCH_NF4_KERNEL", "1") != "0"


if triton is not None:

    if os.environ.get("TRITON_INTERPRET") == "1":  # Triton's interpreter (numpy) never fuses a multiply-add
        @triton.jit
        def _mul_rn(a, b):
            return a * b
    else:
        @triton.jit
        def _mul_rn(a, b):
            # an explicitly rounded multiply: PTX never contracts it with the following add into an fma
            return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                             is_pure=True, pack=1)

    @triton.jit
    def _block_absmax(absmax, absmax_code, absmax_scale, offset, block, inside, NESTED_BLOCK: tl.constexpr,
                      NESTED: tl.constexpr):
        """Each byte's block scale in fp32: a nested absmax dequantized in place (code2[q] * absmax2 + offset)."""
        if NESTED:
            q = tl.load(absmax + block, mask=inside, other=0).to(tl.int32)
            scale = tl.load(absmax_scale + block // NESTED_BLOCK, mask=inside, other=0.0)
            a = _mul_rn(tl.load(absmax_code + q), scale) + tl.load(offset)
        else:
            a = tl.load(absmax + block, mask=inside, other=0.0)
        return a

    @triton.jit
    def _store_pairs(out, start, high, low, n_bytes, BYTES: tl.constexpr):
        """Each byte's two values interleaved, high nibble's first (as bitsandbytes packs), in out's dtype."""
        pair = tl.reshape(tl.join(high, low), [2 * BYTES])
        j = 2 * start + tl.arange(0, 2 * BYTES)
        tl.store(out + j, pair.to(out.dtype.element_ty), mask=j < 2 * n_bytes)

    @triton.jit
    def _dequantize_kernel(packed, absmax, code, absmax_code, absmax_scale, offset, out, n_bytes,
                           HALF_BLOCK: tl.constexpr, NESTED_BLOCK: tl.constexpr, NESTED: tl.constexpr,
                           BYTES: tl.constexpr):
        start = tl.program_id(0).to(tl.int64) * BYTES
        i = start + tl.arange(0, BYTES)
        inside = i < n_bytes
        b = tl.load(packed + i, mask=inside, other=0).to(tl.int32)
        # a block of BLOCKSIZE values is HALF_BLOCK bytes
        a = _block_absmax(absmax, absmax_code, absmax_scale, offset, i // HALF_BLOCK, inside, NESTED_BLOCK, NESTED)
        high = _mul_rn(tl.load(code + (b >> 4)), a)
        low = _mul_rn(tl.load(code + (b & 0xF)), a)
        _store_pairs(out, start, high, low, n_bytes, BYTES)

    def _nested_args(code, absmax_code, absmax_scale, offset) -> tuple:
        """The nested absmax's pointers; not nested, unused: any tensor of the right device."""
        return (absmax_code, absmax_scale, offset) if absmax_code is not None else (code, code, code)

    def _launch(packed, absmax, code, absmax_code, absmax_scale, offset, blocksize: int, numel: int,
                dtype: torch.dtype, bytes_per_program: int = BYTES_PER_PROGRAM, num_warps: int = NUM_WARPS
                ) -> torch.Tensor:
        out = torch.empty(numel, dtype=dtype, device=packed.device)
        n_bytes = numel // 2
        nested = _nested_args(code, absmax_code, absmax_scale, offset)
        wrap_triton(_dequantize_kernel)[(triton.cdiv(n_bytes, bytes_per_program),)](
            packed, absmax, code, *nested, out, n_bytes, HALF_BLOCK=blocksize // 2, NESTED_BLOCK=256,
            NESTED=absmax_code is not None, BYTES=bytes_per_program, num_warps=num_warps)
        return out

    @triton_op("tunebench::dequantize_4bit", mutates_args=())
    def _dequantize_4bit(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                         absmax_code: torch.Tensor | None, absmax_scale: torch.Tensor | None,
                         offset: torch.Tensor | None, blocksize: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return _launch(packed, absmax, code, absmax_code, absmax_scale, offset, blocksize, numel, dtype)

    @triton_op("tunebench::dequantize_4bit_again", mutates_args=())
    def _dequantize_4bit_again(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                               absmax_code: torch.Tensor | None, absmax_scale: torch.Tensor | None,
                               offset: torch.Tensor | None, blocksize: int, numel: int,
                               dtype: torch.dtype) -> torch.Tensor:
        return _launch(packed, absmax, code, absmax_code, absmax_scale, offset, blocksize, numel, dtype)

    @triton.jit
    def _to_float8_rows_kernel(packed, absmax, code, absmax_code, absmax_scale, offset, row_scale, out, n_bytes,
                               ROW_BYTES: tl.constexpr, HALF_BLOCK: tl.constexpr, NESTED_BLOCK: tl.constexpr,
                               NESTED: tl.constexpr, BYTES: tl.constexpr):
        """(code[nibble] * absmax) * row_scale in e4m3 (clamped to its largest, 448), row-major: one read of the
        packed bytes, one write; a nested absmax dequantized in place, as `_dequantize_kernel` does."""
        start = tl.program_id(0).to(tl.int64) * BYTES
        i = start + tl.arange(0, BYTES)
        inside = i < n_bytes
        b = tl.load(packed + i, mask=inside, other=0).to(tl.int32)
        a = _block_absmax(absmax, absmax_code, absmax_scale, offset, i // HALF_BLOCK, inside, NESTED_BLOCK, NESTED)
        s = tl.load(row_scale + i // ROW_BYTES, mask=inside, other=0.0)
        high = tl.clamp(_mul_rn(tl.load(code + (b >> 4)), a) * s, -448.0, 448.0)
        low = tl.clamp(_mul_rn(tl.load(code + (b & 0xF)), a) * s, -448.0, 448.0)
        _store_pairs(out, start, high, low, n_bytes, BYTES)

    def _launch_float8(packed, absmax, code, absmax_code, absmax_scale, offset, scale, blocksize: int, rows: int,
                       cols: int) -> torch.Tensor:
        out = torch.empty(rows * cols, dtype=torch.float8_e4m3fn, device=packed.device)
        n_bytes = rows * cols // 2
        nested = _nested_args(code, absmax_code, absmax_scale, offset)
        wrap_triton(_to_float8_rows_kernel)[(triton.cdiv(n_bytes, BYTES_PER_PROGRAM),)](
            packed, absmax, code, *nested, scale, out, n_bytes, ROW_BYTES=cols // 2, HALF_BLOCK=blocksize // 2,
            NESTED_BLOCK=256, NESTED=absmax_code is not None, BYTES=BYTES_PER_PROGRAM, num_warps=NUM_WARPS)
        return out

    @triton_op("tunebench::dequantize_4bit_float8", mutates_args=())
    def _dequantize_4bit_float8(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                                absmax_code: torch.Tensor | None, absmax_scale: torch.Tensor | None,
                                offset: torch.Tensor | None, scale: torch.Tensor, blocksize: int, rows: int,
                                cols: int) -> torch.Tensor:
        return _launch_float8(packed, absmax, code, absmax_code, absmax_scale, offset, scale, blocksize, rows, cols)

    @triton_op("tunebench::dequantize_4bit_float8_again", mutates_args=())
    def _dequantize_4bit_float8_again(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                                      absmax_code: torch.Tensor | None, absmax_scale: torch.Tensor | None,
                                      offset: torch.Tensor | None, scale: torch.Tensor, blocksize: int, rows: int,
                                      cols: int) -> torch.Tensor:
        return _launch_float8(packed, absmax, code, absmax_code, absmax_scale, offset, scale, blocksize, rows, cols)


def to_float8(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, absmax_code: torch.Tensor | None,
              absmax_scale: torch.Tensor | None, offset: torch.Tensor | None, scale: torch.Tensor, blocksize: int,
              shape: tuple[int, int], again: bool = False) -> torch.Tensor:
    """The 4-bit weight (rows x cols) straight to e4m3, each value times the `scale` of its row: what
    `nf4.dequantize` in fp32 followed by that scaling and a cast computes, in one kernel (needs `available(packed)`).
    `again`: the same values from a second entry point, as `dequantize`'s."""
    rows, cols = shape
    op = torch.ops.tunebench.dequantize_4bit_float8_again if again else torch.ops.tunebench.dequantize_4bit_float8
    return op(packed.reshape(-1), absmax, code, absmax_code, absmax_scale, offset, scale, blocksize, rows,
              cols).view(rows, cols)


def dequantize(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int,
               shape: tuple[int, ...], dtype: torch.dtype, absmax_code: torch.Tensor | None = None,
               absmax_scale: torch.Tensor | None = None, offset: torch.Tensor | None = None,
               again: bool = False) -> torch.Tensor:
    """`nf4.dequantize`'s signature and values, as one kernel (needs `available(packed)`)."""
    numel = 1
    for d in shape:
        numel *= d
    op = torch.ops.tunebench.dequantize_4bit_again if again else torch.ops.tunebench.dequantize_4bit
    return op(packed.reshape(-1), absmax, code, absmax_code, absmax_scale, offset, blocksize, numel,
              dtype).view(shape)
