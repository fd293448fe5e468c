"""One rank of `tunebench hw`'s collectives, started by torchrun: job.json in, result.json out (rank 0)."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from tunebench.dist import from_env, rank_session
from tunebench.hw.collectives import measure
from tunebench.launch.processes import die_with_parent
from tunebench.launch.rundir import RunDir
from tunebench.metrics import telemetry


def main(path: str) -> None:
    rundir = RunDir(path)
    job = rundir.job()
    ctx = from_env()
    device = torch.device("cuda", ctx.local_rank) if job["device"] == "cuda" else torch.device("cpu")
    with rank_session(ctx, device, job["timeout"]):
        sampler = telemetry.start(device, job["telemetry"])
        rows = measure(device, job["sizes"], job["iters"], job["warmup"])
        tel = ctx.gather(sampler.stop() if sampler else None)
        if ctx.is_main:
            combined = telemetry.combine(tel)
            rundir.write_result(json.dumps({
                "rows": rows, "world_size": ctx.world_size, "backend": dist.get_backend(),
                "telemetry": combined.model_dump() if combined else None}))


if __name__ == "__main__":
    die_with_parent()
    main(sys.argv[1])
