"""The planner's GPU terms beside a profile of the same step, configuration by configuration.

Each configuration (`tunebench run` options, as profile_trace.py takes them) is profiled by profile_trace.py in its
own process; beside each kind of kernel's GPU milliseconds a step, the planner's term for it (plan.speed's parts,
from the spec sheet of the GPU it ran on). Kinds: matmul, attention, elementwise (Triton's fused kernels, the other
kernels, copies), optimizer. One JSON line per configuration (to --out too), then a table. A refit of
plan.calibration's GEMM, attention and elementwise rows reads these lines: the terms are fitted apart, on the time
each kind of kernel really takes, not on the step's total.

    python benchmarks/probes/planner_terms.py --out terms.jsonl \\
        "--model llama-3.1-8b --method lora --seq-len 1024 --batch-size 4 --grad-ckpt" "--model tinygpt-124m ..."
    python benchmarks/probes/planner_terms.py --from benchmarks/proofs/planner-terms.profiles --out terms.jsonl
    python benchmarks/probes/planner_terms.py --table terms.jsonl   # the table again, with today's planner
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE))

# profile_trace's kinds (vs_plain_gpt._category) as the planner's terms
TERMS = {"matmul": ("matmul",), "attention": ("attention",),
         "elementwise": ("triton (fused)", "other kernels", "copy/memset"), "optimizer": ("optimizer",)}


def planned(options: str, gpu_name: str) -> dict[str, float]:
    """The planner's GPU terms for these options, in ms a step."""
    from profile_trace import config_from_args
    from tunebench.gpus import match
    from tunebench.plan import predict

    p = predict(config_from_args(shlex.split(options)), match(gpu_name))
    return {k: p.time.parts.get(k, 0.0) * 1e3 for k in TERMS} | {"step": p.time.seconds * 1e3}


def measured(ms_by_kind: dict[str, float]) -> dict[str, float]:
    return {term: sum(ms_by_kind.get(k, 0.0) for k in kinds) for term, kinds in TERMS.items()}


def profile(options: str) -> dict:
    """profile_trace.py on these options in its own process (its last stdout line is the profile's JSON)."""
    proc = subprocess.run([sys.executable, str(HERE / "profile_trace.py"), *shlex.split(options)],
                          capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    return json.loads(lines[-1])


def table(rows: list[dict]) -> None:
    print(f"{'configuration':72} " + " ".join(f"{t:>21}" for t in TERMS) + "   (measured / planned ms)")
    for r in rows:
        if "error" in r:
            print(f"{r['options'][:72]:72} failed: {r['error'][-200:]}")
            continue
        plan = planned(r["options"], r["gpu"])
        got = measured(r["ms_by_kind"])
        cells = " ".join(f"{got[t]:8.1f} / {plan[t]:6.1f} {got[t] / plan[t] if plan[t] else 0:4.2f}"
                         for t in TERMS)
        print(f"{r['options'][:72]:72} {cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", help="`tunebench run` options of one configuration, quoted, each")
    ap.add_argument("--from", dest="source", help="a file of configurations, one a line (# comments)")
    ap.add_argument("--out", help="append each configuration's JSON line here")
    ap.add_argument("--table", help="print the table of a file this probe wrote, planned with today's planner")
    args = ap.parse_args()
    if args.table:  # this probe's lines, or a document of them under "runs" (benchmarks/data/)
        text = Path(args.table).read_text()
        doc = json.loads(text) if text.lstrip().startswith("{") and '"runs"' in text[:2000] else None
        return table(doc["runs"] if doc else [json.loads(ln) for ln in text.splitlines() if ln.strip()])
    import torch

    gpu = torch.cuda.get_device_name(0)
    configs = list(args.configs)
    if args.source:
        lines = Path(args.source).read_text().splitlines()
        configs += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    rows = []
    for options in configs:
        row = {"options": options, "gpu": gpu} | profile(options)
        if "error" not in row:
            row["planned_ms"] = planned(options, gpu)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    table(rows)


if __name__ == "__main__":
    main()
