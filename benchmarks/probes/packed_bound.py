"""The packed 8-bit AdamW's buffer bound (engine.optim.PACK_ELEMENTS) against no bound, on one GPU, each its own
process, alternated: tokens/s and peak memory of the same `tunebench run` configuration.

    python benchmarks/probes/packed_bound.py --repeats 2 "model=qwen3-30b-a3b method=qlora batch_size=8 ..."
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

WHOLE = 1 << 62  # no bound: one buffer per dtype, as before the bound


def side(bound: int, pairs: str) -> dict:
    import tunebench.engine.optim as optim
    from tunebench import RunConfig, run

    optim.PACK_ELEMENTS = bound
    kw = dict(p.split("=", 1) for p in pairs.split())
    for k in ("lora_targets",):
        if k in kw:
            kw[k] = kw[k].split(",")
    rec = run(RunConfig(**kw, telemetry=False))
    m = rec.metrics
    return {"bound": bound, "status": rec.status, "tokens_per_s": m.tokens_per_s,
            "peak_alloc_gib": m.peak_mem_allocated_bytes / 2**30 if m.peak_mem_allocated_bytes else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="key=value pairs of the run (lists comma-separated)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--side", type=int, help=argparse.SUPPRESS)  # one side, in its own process
    a = p.parse_args()
    if a.side is not None:
        print(json.dumps(side(a.side, a.config)))
        return
    from tunebench.config import PACKED_ELEMENTS

    results = []
    for _ in range(a.repeats):
        for bound in (WHOLE, PACKED_ELEMENTS):
            out = subprocess.run([sys.executable, __file__, a.config, "--side", str(bound)], capture_output=True,
                                 text=True)
            line = [x for x in out.stdout.splitlines() if x.startswith("{")]
            results.append(json.loads(line[-1]) if line else {"bound": bound, "error": out.stderr[-600:]})
            print(json.dumps(results[-1]), flush=True)
    for bound in (WHOLE, PACKED_ELEMENTS):
        tps = [r["tokens_per_s"] for r in results if r.get("bound") == bound and r.get("tokens_per_s")]
        peak = [r["peak_alloc_gib"] for r in results if r.get("bound") == bound and r.get("peak_alloc_gib")]
        if tps:
            memory = f", peak {max(peak):.2f} GiB" if peak else ""
            print(f"{'no bound' if bound == WHOLE else f'bound {bound:,}':>20}: tokens/s {max(tps):,.0f} "
                  f"(best of {len(tps)}){memory}")


if __name__ == "__main__":
    main()
