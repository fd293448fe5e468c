"""Cost of the NVML telemetry thread: the same run with and without it, alternated, in one process.

    python benchmarks/probes/telemetry_overhead.py [--model tinygpt-124m] [--pairs 3]
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from tunebench import RunConfig, run  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", default="tinygpt-124m")
p.add_argument("--pairs", type=int, default=3)
a = p.parse_args()
base = dict(model=a.model, method="full", seq_len=2048, batch_size=8, steps=40, warmup=10, optimizer="adamw_fused")
rates = {True: [], False: []}
for i in range(a.pairs):
    for tel in ((True, False) if i % 2 == 0 else (False, True)):
        rec = run(RunConfig(**base, telemetry=tel))
        rates[tel].append(rec.metrics.tokens_per_s)
        if tel:
            print("telemetry:", rec.metrics.telemetry, "J/token", rec.metrics.energy_j_per_token)
on, off = statistics.median(rates[True]), statistics.median(rates[False])
print(f"with telemetry {on:,.0f} tokens/s, without {off:,.0f}: overhead {1 - on / off:+.2%} "
      f"(runs: {[round(x) for x in rates[True]]} vs {[round(x) for x in rates[False]]})")
