"""tunebench infer's decode loop against transformers' `generate` on the same model, in one process.

One model (random weights, the preset's shapes) is built once per precision; then for each batch
size: HF `generate` (greedy, exactly N new tokens, its default dynamic cache; as a user writes it)
and tunebench's loop (dynamic cache; and static cache + torch.compile of the decode step, which
replays as a CUDA graph), alternated, each after one untimed warmup, medians over the repeats.
Tokens/s = batch x new tokens / time of the whole generation (prefill included) for every side.

    python benchmarks/compare/vs_hf_generate.py --model mistral-7b --batch-sizes 1,8,32 --precisions bf16,nf4 [--out F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402
from transformers import StaticCache  # noqa: E402

from tunebench.config import InferConfig  # noqa: E402
from tunebench.inference import weights_for  # noqa: E402
from tunebench.inference.generate import generate  # noqa: E402
from tunebench.metrics.timer import synchronize  # noqa: E402
from tunebench.models import resolve_model  # noqa: E402
from tunebench.models.build import build  # noqa: E402


def hf_side(model, ids: torch.Tensor, new: int) -> float:
    synchronize(ids.device)
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    synchronize(ids.device)
    return time.perf_counter() - t0


def ours(model, step, ids: torch.Tensor, new: int, cache) -> float:
    ttft, decode, _ = generate(model, step, ids, new, cache)
    return ttft + decode


def bench_precision(a: argparse.Namespace, spec, precision: str, device: torch.device) -> list[dict]:
    model, _ = build(spec, weights_for(precision, InferConfig()), device)
    model.eval()
    model.generation_config.cache_implementation = None  # HF's default: the dynamic cache
    compiled = None if a.no_compile else torch.compile(
        model, mode="reduce-overhead" if device.type == "cuda" else "default")
    rows = []
    for b in (int(x) for x in a.batch_sizes.split(",")):
        ids = torch.randint(0, spec.vocab_size, (b, a.prompt_len), device=device,
                            generator=torch.Generator(device=device).manual_seed(0))
        static = StaticCache(config=model.config, max_cache_len=a.prompt_len + a.new_tokens)
        sides = {"hf_generate": lambda ids=ids: hf_side(model, ids, a.new_tokens),
                 "ours_dynamic": lambda ids=ids: ours(model, model, ids, a.new_tokens, None)}
        if compiled is not None:
            sides["ours_static_compile"] = lambda ids=ids, static=static: ours(model, compiled, ids, a.new_tokens,
                                                                                 static)
        times: dict[str, list[float]] = {k: [] for k in sides}
        warm = {}
        for k, fn in sides.items():  # warmup (and compilation) first, untimed
            t0 = time.perf_counter()
            fn()
            warm[k] = time.perf_counter() - t0
        for _ in range(a.repeats):  # alternated, so drift hits every side alike
            for k, fn in sides.items():
                times[k].append(fn())
        tps = {k: b * a.new_tokens / statistics.median(v) for k, v in times.items()}
        row = {"model": a.model, "precision": precision, "batch": b, "tokens_per_s": tps, "warmup_s": warm,
               "ratio_vs_hf": {k: v / tps["hf_generate"] for k, v in tps.items()},
               "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        print(f"{precision} batch {b}: " + ", ".join(f"{k} {v:,.1f} tok/s ({row['ratio_vs_hf'][k]:.2f}x)"
                                                     for k, v in tps.items()), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mistral-7b")
    ap.add_argument("--precisions", default="bf16")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out")
    a = ap.parse_args()
    device = torch.device(a.device)
    spec = resolve_model(a.model)
    rows = []
    for precision in a.precisions.split(","):
        rows += bench_precision(a, spec, precision, device)  # its model is freed when it returns
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
