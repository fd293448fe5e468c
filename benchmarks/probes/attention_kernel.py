"""Causal attention's forward and backward alone, at growing sequence lengths, under each of SDPA's 16-bit kernels:
the figures the planner's attention ceiling (plan.calibration: attention_kernel_of_peak) comes from.

    python benchmarks/probes/attention_kernel.py --heads 32 --kv-heads 8 --head-dim 128 \\
        --seq-lens 2048,8192,32768,65536 --out /tmp/attention.json

FLOPs are counted as the planner counts them: a causal forward is 2·S·(H·D) a token (the half of the S x S pairs
below the diagonal, two matmuls), its backward 2.5 times that. Each kernel is timed with CUDA events, median of
`--repeats` after `--warmup`; `auto` is SDPA's own choice with grouped keys (what the engine runs, models.attention).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))

from kernels_vs import timed  # noqa: E402  the median of CUDA-event-timed repetitions


def measure(kernel: str, heads: int, kv_heads: int, dim: int, seq: int, batch: int, warmup: int,
            repeats: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"auto": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, kv_heads, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    grouped = kernel in ("auto", "flash")  # the kernels that group keys themselves; others see them repeated

    def forward():
        kk, vv = (k, v) if grouped else (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
        if backends[kernel] is None:
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=grouped)
        with sdpa_kernel([backends[kernel]]):
            return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=grouped)

    out = forward()
    grad = torch.randn_like(out)
    fwd_ms = timed(forward, repeats, warmup)
    both_ms = timed(lambda: torch.autograd.grad(forward(), (q, k, v), grad), repeats, warmup)
    flops = 2 * seq * heads * dim * seq * batch  # the planner's causal forward, all tokens
    bwd_ms = both_ms - fwd_ms
    return {"kernel": kernel, "seq_len": seq, "batch": batch, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms,
            "fwd_tflops": flops / fwd_ms / 1e9, "bwd_tflops": 2.5 * flops / bwd_ms / 1e9,
            "fwd_bwd_tflops": 3.5 * flops / both_ms / 1e9}


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seq-lens", default="1024,2048,4096,8192,16384,32768,65536,131072")
    p.add_argument("--tokens", type=int, default=16384, help="a batch fills at least this many tokens at short lengths")
    p.add_argument("--kernels", default="auto,flash,cudnn,efficient")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    for seq in [int(s) for s in a.seq_lens.split(",")]:
        batch = max(1, a.tokens // seq)
        for kernel in a.kernels.split(","):
            try:
                r = measure(kernel, a.heads, a.kv_heads, a.head_dim, seq, batch, a.warmup, a.repeats)
            except Exception as err:  # a kernel that does not take this shape says so and the others go on
                r = {"kernel": kernel, "seq_len": seq, "batch": batch, "error": str(err).splitlines()[0][:200]}
            torch.cuda.empty_cache()
            rows.append(r)
            if "error" in r:
                print(f"s{seq:<7d} b{batch:<3d} {kernel:9s} {r['error']}", flush=True)
            else:
                print(f"s{seq:<7d} b{batch:<3d} {kernel:9s} fwd {r['fwd_ms']:9.2f} ms {r['fwd_tflops']:6.1f} TFLOP/s  "
                      f"bwd {r['bwd_ms']:9.2f} ms {r['bwd_tflops']:6.1f}  both {r['fwd_bwd_tflops']:6.1f}", flush=True)
    if a.out:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "shape": {"heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim}}
        Path(a.out).write_text(json.dumps(meta | {"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
