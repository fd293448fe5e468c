"""Long context on one GPU: each configuration's tokens/s and peak memory at growing sequence lengths, each run its
own process, the planner's prediction beside it; a variant stops growing at its first failure (out of memory).

    python benchmarks/probes/long_context.py --preset llama-3.1-8b --method qlora --lora-rank 32 \\
        --seq-lens 65536,131072 --variant "ckpt=--grad-ckpt" --variant "chunk=--grad-ckpt --mlp-chunk 8192"

The model is a local directory written from the preset (random weights, as a preset's): `--layers` cuts its blocks
(the memory a block keeps, per token, is the difference between two cuts), `--max-positions` lifts its positions
(Llama-3.1's 131,072) for contexts beyond them, as long-context fine-tunes do.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

GIB = 1 << 30


def write_model(preset: str, layers: int | None, max_positions: int | None, root: Path) -> Path:
    from tunebench.models.presets import PRESETS

    p = PRESETS[preset]
    shape = {"model_type": p.family} | p.shape
    if layers:
        shape["num_hidden_layers"] = layers
    if max_positions:
        shape["max_position_embeddings"] = max_positions
    config = p.hf_config().__class__(**{k: v for k, v in shape.items() if k != "model_type"})
    folder = root / f"{preset}-{layers or 'all'}l"
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    return folder


def child(args: list[str]) -> dict:
    """One run in this process: its record's figures and the planner's prediction."""
    from tunebench import RunConfig, run
    from tunebench.api.plan import plan

    p = argparse.ArgumentParser()
    p.add_argument("--fields")
    fields = json.loads(p.parse_args(args).fields)
    cfg = RunConfig(**fields)
    try:
        pred = plan(cfg)
        predicted = {"predicted_gib": pred.mem.peak_allocated / GIB, "predicted_tokens_per_s": pred.tokens_per_s,
                     "verdict": pred.verdict}
    except Exception as err:  # the run still says what it measured
        predicted = {"plan_error": str(err)[:300]}
    rec = run(cfg)
    m = rec.metrics
    return {"status": rec.status, "error": (rec.error or "")[-600:], "tokens_per_s": m.tokens_per_s,
            "peak_gib": (m.peak_mem_allocated_bytes or 0) / GIB, "reserved_gib": (m.peak_mem_reserved_bytes or 0) / GIB,
            "peak_rss_gib": (m.peak_rss_bytes or 0) / GIB, "mfu": m.mfu, "losses": m.losses[:3]} | predicted


def cli_fields(line: str) -> dict:
    """`tunebench run` options as RunConfig fields (--grad-ckpt, --mlp-chunk 8192, --offload activations)."""
    words, fields = shlex.split(line), {}
    i = 0
    while i < len(words):
        key = words[i].removeprefix("--").replace("-", "_")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            value = words[i + 1]
            fields[key] = int(value) if value.isdigit() else value
            i += 2
        else:
            fields[key] = True
            i += 1
    return fields


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="llama-3.1-8b")
    p.add_argument("--layers", type=int)
    p.add_argument("--max-positions", type=int)
    p.add_argument("--method", default="qlora")
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-lens", default="65536")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--variant", action="append", default=[], help="NAME=run options (repeatable)")
    p.add_argument("--timeout", type=int, default=900, help="seconds a run may take")
    p.add_argument("--root", default="/tmp/long-context")
    p.add_argument("--out")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a, rest = p.parse_known_args()
    if a.child:
        print("RESULT " + json.dumps(child(rest)), flush=True)
        return
    folder = write_model(a.preset, a.layers, a.max_positions, Path(a.root))
    results = []
    for variant in a.variant or ["ckpt=--grad-ckpt"]:
        name, _, line = variant.partition("=")
        for seq in [int(s) for s in a.seq_lens.split(",")]:
            fields = dict(model=str(folder), method=a.method, lora_rank=a.lora_rank, lora_alpha=a.lora_rank,
                          batch_size=a.batch_size, seq_len=seq, steps=a.steps, warmup=a.warmup,
                          telemetry=False) | cli_fields(line)
            started = time.time()
            cmd = [sys.executable, __file__, "--child", "1", "--fields", json.dumps(fields)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                                      env=os.environ | {"PYTHONUNBUFFERED": "1"})
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                r = json.loads(lines[-1][7:]) if lines else {"status": "crashed",
                                                             "error": (proc.stderr or proc.stdout)[-800:]}
            except subprocess.TimeoutExpired:
                r = {"status": "timeout", "error": f"over {a.timeout} s"}
            r |= {"variant": name, "options": line, "seq_len": seq, "layers": a.layers or "all",
                  "wall_s": round(time.time() - started, 1)}
            results.append(r)
            if a.out:
                Path(a.out).write_text(json.dumps(results, indent=2))
            pred = (f"planned {r['predicted_gib']:.2f} GiB {r['predicted_tokens_per_s']:,.0f} tok/s"
                    if "predicted_gib" in r else r.get("plan_error", ""))
            if r["status"] == "ok":
                print(f"{name:14s} s{seq:<7d} {r['tokens_per_s']:9,.0f} tok/s  {r['peak_gib']:6.2f} GiB  "
                      f"(reserved {r['reserved_gib']:.2f}, host rss {r['peak_rss_gib']:.1f})  mfu {r['mfu'] or 0:.3f}  "
                      f"{pred}  [{r['wall_s']} s]", flush=True)
            else:
                print(f"{name:14s} s{seq:<7d} {r['status']}: {r['error'][-300:]}  {pred}  [{r['wall_s']} s]",
                      flush=True)
                break


if __name__ == "__main__":
    main()
