"""The fused loss inside the whole-model graph, as the engine traces it (ours) against other forms of it.

- `ours-sum`: the head's gradient summed out of place (`acc + (a @ b).float()`), the form before its opaque in-place
  op: a plain traced `add_`, which dynamo functionalizes into the same graph. Inductor fused every group's sum into
  one kernel at the loss's end.
- `ours-inplace`: each chunk's softmax gradient in the in-place form traced (`_loss_and_grad_eager`, the CPU's), the
  graph's form before the pure one (`_loss_and_grad_pure`, the one also compiled apart on GPUs).

Each side is `tunebench.run` with the whole model compiled (`compile_scope: model`), in a process of its own, one
after the other in this one job. Prints tokens/s, peak memory and the last loss per side, and each against ours;
our side's records are saved to the store TUNEBENCH_STORE names, if any.

    python benchmarks/compare/vs_traced_loss.py --shapes llama-3.2-1b:4096:2,tinygpt-124m:2048:8 [--sides ours,ours-sum]
    python benchmarks/compare/vs_traced_loss.py --device cpu --shapes tinygpt-124m:64:1 --steps 3 --warmup 1  # smoke
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE))

from sides import add_arguments, as_side_process, chosen, run_side, save  # noqa: E402

SIDES = ("ours", "ours-sum", "ours-inplace")
GIB = 2 ** 30


def ours(a: argparse.Namespace, side: str, _world: int) -> dict:
    from tunebench import RunConfig, run
    from tunebench.engine import loss

    if side == "ours-sum":  # traced, functionalized into `acc + product`: the sum the graph made before
        loss._accumulate_in_graph = lambda acc, x, y: acc.add_((x @ y).float())
    if side == "ours-inplace":
        loss._loss_and_grad = _in_place_in_graph(loss)
    cfg = RunConfig(model=a.model, method="full", seq_len=a.seq_len, batch_size=a.batch_size, steps=a.steps,
                    warmup=a.warmup, optimizer="adamw_fused", device=a.device, compile=True, compile_scope="model",
                    telemetry=False, tag=["vs_traced_loss"])
    rec = run(cfg, os.environ.get("TUNEBENCH_STORE") if side == "ours" else None)  # the engine's own runs kept
    m = rec.metrics
    return {"side": side, "model": a.model, "seq_len": a.seq_len, "batch_size": a.batch_size, "status": rec.status,
            "error": rec.error, "tokens_per_s": m.tokens_per_s, "loss_last": m.loss_last,
            "peak_alloc_gib": m.peak_mem_allocated_bytes / GIB if m.peak_mem_allocated_bytes else None}


def _in_place_in_graph(loss):
    engine = loss._loss_and_grad

    def in_place(logits, y, vocab, valid, dtype):  # called by name from the loss's forward: the patch is traced
        import torch

        if torch.compiler.is_compiling():
            return loss._loss_and_grad_eager(logits, y, vocab, valid, dtype)
        return engine(logits, y, vocab, valid, dtype)
    return in_place


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
    print(f"\n{'shape':<24}{'side':<11}{'tokens/s':>12}{'peak GiB':>10}{'loss':>8}")
    by = {(r["shape"], r["side"]): r for r in results if r.get("status") == "ok"}
    for r in results:
        if r.get("status") != "ok":
            print(f"{r['shape']:<24}{r['side']:<11}  {r.get('status')}: {str(r.get('error'))[-300:]}")
            continue
        print(f"{r['shape']:<24}{r['side']:<11}{r['tokens_per_s']:>12,.0f}{r['peak_alloc_gib'] or 0:>10.2f}"
              f"{r['loss_last']:>8.3f}")
    for shape in dict.fromkeys(r["shape"] for r in results):
        for other in SIDES[1:]:
            ours, them = by.get((shape, "ours")), by.get((shape, other))
            if ours and them:
                mem = (f", memory {ours['peak_alloc_gib'] - them['peak_alloc_gib']:+.2f} GiB"
                       if ours["peak_alloc_gib"] and them["peak_alloc_gib"] else "")
                print(f"{shape}: ours / {other} tokens/s {ours['tokens_per_s'] / them['tokens_per_s']:.3f}{mem}")


if __name__ == "__main__":
    main()
