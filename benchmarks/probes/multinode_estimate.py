"""Expected scaling to 2-8 nodes of 8 GPUs, from the planner: the intra-node collectives measured on 4x H200
(`tunebench hw`, records in tests/data/planner), the cross-node bandwidth per GPU an assumption (no multi-node
machine was available): 25 GB/s (200 Gb/s NICs, the planner's default) and 50 GB/s (400 Gb/s, a common H200
cluster). Prints tokens/s per GPU and scaling efficiency against one node.

    python benchmarks/probes/multinode_estimate.py
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

from tunebench.config import RunConfig
from tunebench.gpus import match
from tunebench.plan import predict

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "planner"
hardware = importlib.import_module("tunebench.plan.hardware")  # the module (the package exports a function so named)
JOBS = {
    "Llama-3-8B full FSDP2 s4096 b2 ckpt": dict(model="llama-3-8b", strategy="fsdp", seq_len=4096, batch_size=2,
                                                 grad_ckpt=True, optimizer="adamw_fused"),
    "Llama-3-8B full FSDP2 s4096 b4": dict(model="llama-3-8b", strategy="fsdp", seq_len=4096, batch_size=4,
                                           optimizer="adamw_fused"),
    # HSDP: shard within each node of 8, replicate across nodes (shard_size = processes per node)
    "Llama-3-8B full HSDP s4096 b2 ckpt": dict(model="llama-3-8b", strategy="fsdp", shard_size=8, seq_len=4096,
                                               batch_size=2, grad_ckpt=True, optimizer="adamw_fused"),
    "Llama-3-8B full HSDP s4096 b4": dict(model="llama-3-8b", strategy="fsdp", shard_size=8, seq_len=4096,
                                          batch_size=4, optimizer="adamw_fused"),
    "Llama-3-70B QLoRA FSDP2 s2048 b4 ckpt": dict(model="llama-3-70b", method="qlora", strategy="fsdp",
                                                   seq_len=2048, batch_size=4, grad_ckpt=True),
    "TinyGPT 124M DDP s2048 b8": dict(model="tinygpt-124m", strategy="ddp", seq_len=2048, batch_size=8),
}


def measured(gpu) -> list[tuple[str, dict]]:
    out = []
    for f in sorted(DATA.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") == "hw" and r.get("status") == "ok" and match(r["environment"]["gpu"]["name"]) == gpu:
                out.append((r["created_at"], r["id"][:12], r["metrics"]))
    return [(i, m) for _, i, m in sorted(out, key=lambda t: t[0], reverse=True)]


def main() -> None:
    gpu = match("H200")
    hw = measured(gpu)
    for gbps in (25.0, 50.0):
        hardware.CAL = dataclasses.replace(hardware.CAL, inter_node_gbps=gbps)  # plan.calibration's row
        print(f"\ncross-node bandwidth {gbps:.0f} GB/s per GPU")
        print(f"{'job':40} " + " ".join(f"{f'{n} node(s)':>22}" for n in (1, 2, 4, 8)))
        for name, kw in JOBS.items():
            cells, base = [], None
            for nodes in (1, 2, 4, 8):
                cfg = RunConfig(**kw, nproc_per_node=8, nnodes=nodes,
                                rdzv_endpoint="node0:29400" if nodes > 1 else None)
                p = predict(cfg, gpu, 8 * nodes, hw)
                per = p.tokens_per_s / p.world
                base = base or per
                cells.append(f"{per:>10,.0f} /GPU {per / base:6.1%}")
            print(f"{name:40} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
