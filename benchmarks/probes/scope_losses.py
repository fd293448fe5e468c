"""The same short run eager, compiled per block and compiled whole, on one device: the losses step by step must agree
(a graph that computes the loss but not the update would show here first).

    python benchmarks/probes/scope_losses.py [--model tinygpt-124m] [--precisions fp32,bf16] [--steps 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tinygpt-124m")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    from tunebench import RunConfig, run

    for precision in a.precisions.split(","):
        for scope in ("eager", "blocks", "model"):
            cfg = RunConfig(model=a.model, method="full", steps=a.steps, warmup=1, seq_len=256, batch_size=4, lr=1e-3,
                            precision=precision, compile=scope != "eager", device=a.device, telemetry=False,
                            compile_scope=scope if scope != "eager" else "auto", dropout=0.0)
            rec = run(cfg)
            losses = " ".join(f"{x:.4f}" for x in rec.metrics.losses or [])
            print(f"{precision:5} {scope:6} {rec.status}: {losses} {rec.error or ''}", flush=True)


if __name__ == "__main__":
    main()
