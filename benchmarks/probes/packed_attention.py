"""Attention over packed rows, five ways (all compiled), forward + backward timed on one GPU in one job.

    python benchmarks/probes/packed_attention.py  # GPT-2 small, Llama-3.2-1B and Llama-3-8B shapes, bf16 and fp32

A packed row holds several examples, kept apart by position ids that restart at 0. The ways compared:
  causal  SDPA's causal kernel over whole rows: what a row of one sequence costs (the benchmark's rows), the ceiling
  flash   the same held to SDPA's flash kernel (the one varlen runs; SDPA may prefer cuDNN's)
  masked  SDPA with the dense block-diagonal causal mask transformers builds from packed position ids
  flex    FlexAttention compiled, with a block mask of the documents (blocks across examples skipped)
  ours    tunebench's varlen path (models.attention.varlen_attention: torch's variable-length flash kernel over
          the rows flattened, one sequence per example), as the engine calls it
Each way's output is checked against `masked` before it is timed. Document lengths are drawn as a packed corpus
lays them out (next fit, lengths log-uniform from 32 to the row); `--docs-per-row 1` is the benchmark's row.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

SHAPES = {  # batch, seq, query heads, key/value heads, head dim
    "gpt2-small s1024 b4": (4, 1024, 12, 12, 64),
    "llama-3.2-1b s2048 b2": (2, 2048, 32, 8, 64),
    "llama-3-8b s4096 b1": (1, 4096, 32, 8, 128),
}


def positions_of(batch: int, seq: int, gen: torch.Generator, docs_per_row: int | None) -> torch.Tensor:
    """Position ids of packed rows: each example's positions restart at 0."""
    rows = []
    for _ in range(batch):
        pos: list[int] = []
        while len(pos) < seq:
            if docs_per_row:
                n = math.ceil(seq / docs_per_row)
            else:
                n = int(math.exp(torch.empty(1).uniform_(math.log(32), math.log(seq), generator=gen).item()))
            pos += list(range(min(n, seq - len(pos))))
        rows.append(pos)
    return torch.tensor(rows)


def dense_mask(positions: torch.Tensor) -> torch.Tensor:
    """(B, 1, S, S) bool: causal within each example, as transformers' sdpa_mask builds it for packed rows."""
    doc = (positions == 0).cumsum(-1)
    causal = torch.ones(positions.shape[1], positions.shape[1], dtype=torch.bool, device=positions.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def make_ways(positions: torch.Tensor, hq: int, hkv: int):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from tunebench.engine.data import documents_of
    from tunebench.models.attention import sdpa_causal, varlen_attention

    sdpa_causal()  # reads the GPU and torch's varlen keywords

    b, s = positions.shape
    mask = dense_mask(positions)
    cu = documents_of(positions.cpu(), capacity=None).to(positions.device)
    doc = (positions == 0).cumsum(-1)

    def document_causal(bi, h, qi, ki):
        return (doc[bi, qi] == doc[bi, ki]) & (qi >= ki)

    block = create_block_mask(document_causal, b, None, s, s, device=positions.device)
    gqa = hq != hkv

    def causal(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def flash(q, k, v):  # the same held to the flash kernel (varlen's), where SDPA would take cuDNN's
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def masked(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)

    def flex_way(q, k, v):
        return flex_attention(q, k, v, block_mask=block, enable_gqa=gqa)

    def ours(q, k, v):  # (B, S, H, D) out as transformers' attention functions return it: back to (B, H, S, D)
        return varlen_attention(q, k, v, cu).transpose(1, 2)

    # compiled, as the engine runs them: eager, a custom op's Python dispatch would be timed with the kernels
    ways = {"causal": causal, "flash": flash, "masked": masked, "flex": flex_way, "ours": ours}
    return {name: torch.compile(fn) for name, fn in ways.items()}


def timed(fn, q, k, v, iters: int) -> tuple[float, float]:
    """Milliseconds per forward + backward: the GPU's kernels summed (what the attention costs the GPU; small
    shapes launched eagerly leave the GPU waiting on the host), and the wall time."""
    from torch.profiler import ProfilerActivity, profile

    grad = torch.ones_like(q)
    for _ in range(3):
        fn(q, k, v).backward(gradient=grad)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(q, k, v).backward(gradient=grad)
        end.record()
        torch.cuda.synchronize()
    kernels = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return kernels / 1000 / iters, start.elapsed_time(end) / iters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--docs-per-row", type=int, default=None, help="equal examples per row (default: drawn)")
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, (b, s, hq, hkv, d) in SHAPES.items():
        positions = positions_of(b, s, gen, a.docs_per_row).cuda()
        docs = int((positions == 0).sum())
        ways = make_ways(positions, hq, hkv)
        for dt in a.dtypes.split(","):
            dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
            q = torch.randn(b, hq, s, d, device="cuda", dtype=dtype, requires_grad=True)
            k = torch.randn(b, hkv, s, d, device="cuda", dtype=dtype, requires_grad=True)
            v = torch.randn(b, hkv, s, d, device="cuda", dtype=dtype, requires_grad=True)
            ref = ways["masked"](q, k, v)
            line = []
            for way, fn in ways.items():
                try:
                    out = fn(q, k, v)
                    err = "" if way in ("causal", "flash") else f" err {(out - ref).abs().max().item():.1e}"
                    line.append((way, *timed(fn, q, k, v, a.iters), err))
                except Exception as e:  # noqa: BLE001 - a way the GPU or dtype lacks is reported, not fatal
                    line.append((way, float("nan"), float("nan"), f" {type(e).__name__}: {str(e)[:60]}"))
            base = {w: t for w, t, _, _ in line}["masked"]
            print(f"{name} {dt} ({docs} examples), GPU ms (wall ms): " + "; ".join(
                f"{w} {t:.3f} ({wall:.3f}, {base / t:.2f}x masked){e}" for w, t, wall, e in line), flush=True)

if __name__ == "__main__":
    main()
