"""The whole-model graph's head gradient: accumulated in place by one opaque op (ours) against summed out of place
(`ours-sum`, the form before: `acc + (a @ b).float()` traced, which inductor fused into one sum at the loss's end).

Each side is `tunebench.run` with the whole model compiled (`compile_scope: model`), in a process of its own, one
after the other in this one job; `ours-sum` swaps the op for a plain traced `add_` (functionalized to the same graph
as the form before). Prints tokens/s, peak memory and the last loss per side, and ours over the form before; our
side's records are saved to the store TUNEBENCH_STORE names, if any.

    python benchmarks/vs_traced_sum.py --shapes llama-3.2-1b:4096:2,tinygpt-124m:2048:8 [--out F.json]
    python benchmarks/vs_traced_sum.py --device cpu --shapes tinygpt-124m:64:1 --steps 3 --warmup 1  # smoke
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from sides import add_arguments, as_side_process, chosen, run_side, save  # noqa: E402

SIDES = ("ours", "ours-sum")
GIB = 2 ** 30


def ours(a: argparse.Namespace, side: str, _world: int) -> dict:
    from tunebench import RunConfig, run
    from tunebench.engine import loss

    if side == "ours-sum":  # traced, functionalized into `acc + product`: the sum the graph made before
        loss._accumulate_in_graph = lambda acc, x, y: acc.add_((x @ y).float())
    cfg = RunConfig(model=a.model, method="full", seq_len=a.seq_len, batch_size=a.batch_size, steps=a.steps,
                    warmup=a.warmup, optimizer="adamw_fused", device=a.device, compile=True, compile_scope="model",
                    telemetry=False, tag=["vs_traced_sum"])
    rec = run(cfg, os.environ.get("TUNEBENCH_STORE") if side == "ours" else None)  # the engine's own runs kept
    m = rec.metrics
    return {"side": side, "model": a.model, "seq_len": a.seq_len, "batch_size": a.batch_size, "status": rec.status,
            "error": rec.error, "tokens_per_s": m.tokens_per_s, "loss_last": m.loss_last,
            "peak_alloc_gib": m.peak_mem_allocated_bytes / GIB if m.peak_mem_allocated_bytes else None}


def not_plain(_a: argparse.Namespace) -> None:
    raise SystemExit("no plain side here")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="llama-3.2-1b:4096:2", help="model:seq_len:batch_size, comma-separated")
    p.add_argument("--model", help=argparse.SUPPRESS)  # one shape, in a side's own process
    p.add_argument("--seq-len", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=8)
    add_arguments(p, SIDES, ",".join(SIDES))
    a = p.parse_args()
    if as_side_process(a, not_plain, ours):
        return
    results: list[dict] = []
    for shape in a.shapes.split(","):
        model, seq_len, batch_size = shape.split(":")
        args = ["--model", model, "--seq-len", seq_len, "--batch-size", batch_size, "--steps", str(a.steps),
                "--warmup", str(a.warmup), "--device", a.device]
        for side in chosen(p, a, SIDES):
            results.append(run_side(__file__, side, 1, args, a.side_timeout) | {"shape": shape})
            save(a.out, results)
    summary(results)


def summary(results: list[dict]) -> None:
    print(f"\n{'shape':<24}{'side':<10}{'tokens/s':>12}{'peak GiB':>10}{'loss':>8}")
    by = {(r["shape"], r["side"]): r for r in results if r.get("status") == "ok"}
    for r in results:
        if r.get("status") != "ok":
            print(f"{r['shape']:<24}{r['side']:<10}  {r.get('status')}: {str(r.get('error'))[-300:]}")
            continue
        print(f"{r['shape']:<24}{r['side']:<10}{r['tokens_per_s']:>12,.0f}{r['peak_alloc_gib'] or 0:>10.2f}"
              f"{r['loss_last']:>8.3f}")
    for shape in dict.fromkeys(r["shape"] for r in results):
        new, old = by.get((shape, "ours")), by.get((shape, "ours-sum"))
        if new and old:
            mem = (f", memory {new['peak_alloc_gib'] - old['peak_alloc_gib']:+.2f} GiB"
                   if new["peak_alloc_gib"] and old["peak_alloc_gib"] else "")
            print(f"{shape}: ours / sum tokens/s {new['tokens_per_s'] / old['tokens_per_s']:.3f}{mem}")


if __name__ == "__main__":
    main()
