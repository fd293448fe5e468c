"""4-bit dequantization on Mistral-7B's layer shapes: bitsandbytes' CUDA kernel, inductor's kernel for the torch
ops (`models.nf4.dequantize` compiled), and tunebench's Triton kernel (`models.nf4_kernel`), eager and compiled.

Each shape is NF4 with nested absmax (bitsandbytes' QLoRA default), dequantized to bf16; the values of every
side are checked equal to bitsandbytes' bit for bit. Prints the GPU time per call (kernels only, from the
profiler), the bandwidth reached (bytes read + written), and a Mistral-7B step's dequantization time per pass
(32 blocks of q, k, v, o, gate, up, down); ours also at several tilings.

    python benchmarks/compare/dequant_vs.py [--reps 200] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

# Mistral-7B's linears (out, in) and how many of each a block has
SHAPES = {"q/o": ((4096, 4096), 2), "k/v": ((1024, 4096), 2), "gate/up": ((14336, 4096), 2),
          "down": ((4096, 14336), 1)}
LAYERS = 32
TILINGS = [(512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 8)]  # (bytes per program, warps) tried for ours


def gpu_ms(fn, reps: int) -> float:
    """Milliseconds of GPU kernel time per call (the profiler's sum over `reps` calls): the calls are queued
    back to back, but small ones would otherwise measure the host's launch time, not the kernel's."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.elapsed_us() for e in kernels) / reps / 1e3


def _sides(shape: tuple[int, int], compiled_ops, compiled_kernel) -> tuple[dict, torch.Tensor, int]:
    """Each side's call on one quantized weight of `shape`, bitsandbytes' output, and the bytes a call moves."""
    import bitsandbytes.functional as BF

    from tunebench.models import nf4_kernel

    w = torch.randn(shape, device="cuda") / 32
    packed, qs = BF.quantize_4bit(w.to(torch.bfloat16), blocksize=64, quant_type="nf4", compress_statistics=True)
    nest = (qs.state2.code, qs.state2.absmax, qs.offset)
    args = (packed, qs.absmax, qs.code, qs.blocksize, tuple(qs.shape), torch.bfloat16, *nest)
    sides = {"bitsandbytes": lambda: BF.dequantize_4bit(packed, qs),
             "torch ops, compiled": lambda: compiled_ops(*args),
             "triton kernel": lambda: nf4_kernel.dequantize(*args),
             "triton kernel, compiled": lambda: compiled_kernel(*args)}
    for bpp, warps in TILINGS:
        sides[f"triton {bpp} B x {warps} warps"] = (
            lambda bpp=bpp, warps=warps: nf4_kernel._launch(packed.reshape(-1), qs.absmax, qs.code, *nest, 64,
                                                            w.numel(), torch.bfloat16, bpp, warps).view(shape))
    moved = packed.numel() + qs.absmax.numel() + 2 * w.numel()  # bytes read (packed, 8-bit absmax), written (bf16)
    return sides, sides["bitsandbytes"](), moved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out")
    a = p.parse_args()
    from tunebench.models import nf4, nf4_kernel

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    compiled_ops = torch.compile(nf4.dequantize, dynamic=False)
    compiled_kernel = torch.compile(nf4_kernel.dequantize, dynamic=False)
    rows, per_pass = [], {}
    for name, (shape, count) in SHAPES.items():
        sides, ref, moved = _sides(shape, compiled_ops, compiled_kernel)
        for side, fn in sides.items():
            equal = torch.equal(fn(), ref)
            ms = gpu_ms(fn, a.reps)
            per_pass[side] = per_pass.get(side, 0.0) + ms * count * LAYERS
            rows.append(dict(shape=name, side=side, us=round(ms * 1e3, 2), gb_s=round(moved / ms / 1e6, 1),
                             equal_to_bitsandbytes=equal))
            print(f"{name:8} {side:26} {ms * 1e3:8.1f} us  {moved / ms / 1e6:7.1f} GB/s  equal {equal}", flush=True)
    print("\nMistral-7B, one pass over every 4-bit linear (32 blocks):")
    for side, ms in per_pass.items():
        print(f"  {side:26} {ms:6.2f} ms   x{per_pass['torch ops, compiled'] / ms:.2f} vs torch ops compiled, "
              f"x{per_pass['bitsandbytes'] / ms:.2f} vs bitsandbytes")
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows,
                  per_pass_ms={k: round(v, 3) for k, v in per_pass.items()})
    if a.out:
        tmp = Path(a.out + ".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(a.out)


if __name__ == "__main__":
    main()
