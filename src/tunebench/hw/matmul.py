"""Maximum achievable matmul FLOP/s (MAMF), measured as stas00's mamf-finder does.

For each shape (m, n, k): A is m x k, B is n x k used transposed, C = A @ B^T written into a
preallocated C. Before every timed call the L2 cache is flushed (a 256 MiB buffer is zeroed) and C
is overwritten with random values, so no call finds its operands or result in cache; each call is
timed alone between two CUDA events. Per shape: mean, median and best of the timed calls, as
TFLOP/s = 2·m·n·k / seconds / 1e12. The MAMF is the highest per-shape mean over the sweep, at the
shape that gave it. The spec sheet's peak is never reached; this is the bar an MFU can be held to.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable

import torch

from tunebench.metrics.timer import time_calls

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32,
          "fp8": torch.float8_e4m3fn}
L2_FLUSH_BYTES = 256 * 2**20  # larger than any current GPU's L2 (mamf-finder uses the same)

# The sweep: shapes of the sizes LLM training multiplies (hidden 4096-16384, MLP up to 14336).
GPU_SHAPES = [(m, n, k) for m in range(2048, 16385, 2048) for n in (4096, 8192, 14336) for k in (4096, 8192)]
GPU_QUICK = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 8192, 4096), (8192, 14336, 4096), (16384, 4096, 8192)]
CPU_SHAPES = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048)]
CPU_QUICK = [(256, 256, 256), (512, 512, 512)]


def tflops(m: int, n: int, k: int, seconds: float) -> float:
    """A matmul of (m x k) by (k x n) is m·n·k multiply-adds: 2·m·n·k floating-point operations."""
    return 2 * m * n * k / seconds / 1e12


def default_dtypes(device: torch.device) -> list[str]:
    if device.type != "cuda":
        return ["fp32", "bf16"]
    return ["bf16", "fp16", "tf32"] + (["fp8"] if has_fp8(device) else [])


def has_fp8(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def shapes(device: torch.device, quick: bool) -> list[tuple[int, int, int]]:
    if device.type == "cuda":
        return GPU_QUICK if quick else GPU_SHAPES
    return CPU_QUICK if quick else CPU_SHAPES


@contextlib.contextmanager
def _tf32(on: bool):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _matmul(m: int, n: int, k: int, dtype: str, device: torch.device) -> tuple[Callable[[], None], torch.Tensor]:
    """The timed call, and the output it overwrites."""
    out_dtype = torch.bfloat16 if dtype == "fp8" else DTYPES[dtype]
    c = torch.empty(m, n, dtype=out_dtype, device=device)
    if dtype == "fp8":  # tensor-wise scaled fp8 GEMM, bf16 out (what fp8 training recipes run)
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt needs
        one = torch.ones((), device=device)
        return (lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16, out=c)), c
    a = torch.randn(m, k, device=device).to(DTYPES[dtype])
    b = torch.randn(n, k, device=device).to(DTYPES[dtype]).t()
    return (lambda: torch.mm(a, b, out=c)), c


def measure_shape(m: int, n: int, k: int, dtype: str, device: torch.device, iters: int, warmup: int) -> dict:
    call, c = _matmul(m, n, k, dtype, device)
    c_rand = torch.randn(m, n, device=device).to(c.dtype)
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device) if device.type == "cuda" else None

    def reset() -> None:
        if flush is not None:
            flush.zero_()
        c.copy_(c_rand)

    with _tf32(dtype == "tf32"), torch.no_grad():
        times = time_calls(call, device, iters, warmup, before=reset)
    return {"m": m, "n": n, "k": k, "mean_tflops": tflops(m, n, k, statistics.fmean(times)),
            "median_tflops": tflops(m, n, k, statistics.median(times)), "max_tflops": tflops(m, n, k, min(times))}


def sweep(dtype: str, device: torch.device, quick: bool, iters: int, warmup: int,
          progress: Callable[[str], None] | None = None) -> dict:
    """Every shape at one dtype; the best per-shape mean, median and max, and the geometric mean."""
    rows = []
    todo = shapes(device, quick)
    for i, (m, n, k) in enumerate(todo, 1):
        rows.append(measure_shape(m, n, k, dtype, device, iters, warmup))
        if progress and (i % max(1, len(todo) // 6) == 0 or i == len(todo)):  # a few lines, not one per shape
            best = max(r["mean_tflops"] for r in rows)
            progress(f"matmul {dtype}: {i}/{len(todo)} shapes, best mean "
                     f"{f'{best:,.1f}' if best >= 10 else f'{best:.3g}'} TFLOP/s")  # a CPU's are fractions of one
    best = max(rows, key=lambda r: r["mean_tflops"])
    return {
        "dtype": dtype, "shapes_tried": len(rows), "iters": iters, "warmup": warmup,
        "best_mean_tflops": best["mean_tflops"], "best_shape": [best["m"], best["n"], best["k"]],
        "best_median_tflops": max(r["median_tflops"] for r in rows),
        "best_max_tflops": max(r["max_tflops"] for r in rows),
        "geomean_tflops": statistics.geometric_mean(r["mean_tflops"] for r in rows),
        "shapes": rows,
    }
