"""One rank of `tunebench hw`'s collectives, started by torchrun: job.json in, result.json out (rank 0)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tunebench.hw.collectives import measure
from tunebench.launch.context import from_env, init_process_group
from tunebench.metrics import telemetry


def main(rundir: str) -> None:
    """One rank under torchrun: job.json in, rank 0 writes result.json (rows + every rank's telemetry)."""
    job = json.loads((Path(rundir) / "job.json").read_text())
    ctx = from_env()
    device = torch.device("cuda", ctx.local_rank) if job["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_process_group(ctx, device, job["timeout"])
    try:
        sampler = telemetry.start(device, job["telemetry"])
        rows = measure(device, job["sizes"], job["iters"], job["warmup"])
        tel = ctx.gather(sampler.stop() if sampler else None)
        if ctx.is_main:
            out = {"rows": rows, "world_size": ctx.world_size, "backend": dist.get_backend(),
                   "telemetry": telemetry.combine(tel)}
            (Path(rundir) / "result.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
