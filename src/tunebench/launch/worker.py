"""One rank of a distributed run, started by torchrun: ``python -m tunebench.launch.worker RUNDIR``.

RUNDIR/job.json holds the config and where to store the result. Each rank writes its own figures
(rank-R.json) as soon as its loop ends and its error (error-rank-R.txt) if it fails, so that a run
whose other ranks die still leaves what the finished ranks measured. Rank 0 writes the combined
record to the store and to RUNDIR/result.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def apply_scaling(rec, base: dict | None) -> None:
    """Speedup and efficiency against the scaling series' first run; {"self": True} marks that run."""
    m = rec.metrics
    if not base or not m.tokens_per_s:
        return
    if base.get("self"):
        base = {"id": rec.id, "world_size": m.world_size, "tokens_per_s": m.tokens_per_s}
    speedup = m.tokens_per_s / base["tokens_per_s"]
    m.scaling = {"baseline_id": base["id"], "baseline_world_size": base["world_size"], "speedup": speedup,
                 "efficiency": speedup * base["world_size"] / m.world_size}


@record  # torchrun's failure summary then shows this rank's traceback
def main(rundir: Path) -> None:
    from tunebench.config import RunConfig
    from tunebench.launch.context import destroy, from_env, init_process_group
    from tunebench.report.progress import run_progress
    from tunebench.runner import execute, preflight
    from tunebench.store import Store

    started = time.perf_counter()
    job = json.loads((rundir / "job.json").read_text())
    cfg = RunConfig.model_validate(job["config"])
    ctx = from_env()
    plan = preflight(cfg, ctx.local_rank)
    if plan.device.type == "cuda":
        torch.cuda.set_device(plan.device)
    init_process_group(ctx, plan.device, cfg.timeout)
    try:
        with run_progress(cfg) as progress:
            rec = execute(plan, progress, started, ctx, rank_file=rundir / f"rank-{ctx.rank}.json",
                          record_id=job.get("record_id"))
    except BaseException as err:
        status = "oom" if isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError)) else "failed"
        write_atomic(rundir / f"error-rank-{ctx.rank}.txt",
                     json.dumps({"rank": ctx.rank, "status": status, "error": traceback.format_exc()[-4000:]}))
        raise
    if ctx.is_main:
        rec.sweep_id = job.get("sweep_id")
        apply_scaling(rec, job.get("scaling_baseline"))
        if job.get("store"):
            with Store(job["store"]) as store:
                store.save(rec)
        write_atomic(rundir / "result.json", rec.model_dump_json())
    destroy()


if __name__ == "__main__":
    with __import__("contextlib").redirect_stdout(sys.stderr):
        main(Path(sys.argv[1]))
