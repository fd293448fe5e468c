"""One rank of a distributed run, started by torchrun: ``python -m tunebench.launch.worker RUNDIR``.

RUNDIR/job.json holds the config (launch/rundir.py). Each rank writes its own figures as soon as its
loop ends and its error if it fails, so that a run whose other ranks die still leaves what the
finished ranks measured. Rank 0 writes the combined record as RUNDIR/result.json.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from tunebench.launch import lean
from tunebench.launch.processes import die_with_parent, exit_now


@record  # torchrun's failure summary then shows this rank's traceback
def main(rundir_path: Path) -> None:
    from tunebench.config import RunConfig, TrainConfig
    from tunebench.console.progress import run_progress
    from tunebench.dist import from_env, rank_session
    from tunebench.launch.rundir import RunDir
    from tunebench.run_preflight import preflight
    from tunebench.runner import execute
    from tunebench.status import failure

    started = time.perf_counter()
    rundir = RunDir(rundir_path)
    job = rundir.job()
    inputs = job.get("inputs")
    cfg = (TrainConfig if inputs is not None else RunConfig).model_validate(job["config"])
    ctx = from_env()
    plan = preflight(cfg, ctx.local_rank)
    with rank_session(ctx, plan.device, cfg.timeout), _watched(cfg.timeout, ctx.rank, rundir):
        try:
            if inputs is not None:  # a training job: its hooks log; every rank runs it
                from tunebench.trainer.inputs import JobInputs
                from tunebench.trainer.job import execute_train

                rec = execute_train(plan, JobInputs.from_json(inputs), started, ctx, rundir.write_rank)
            else:
                with run_progress(cfg) as progress:
                    rec = execute(plan, progress, started, ctx, on_rank_figures=rundir.write_rank)
        except BaseException as err:
            rundir.write_error(ctx.rank, failure(err)[0], traceback.format_exc()[-4000:])
            raise
        if ctx.is_main:
            rundir.write_result(rec.model_dump_json())


def _watched(timeout_s: float, rank: int, rundir):
    """Every rank of a distributed run is watched: one with no step for `timeout` seconds ends them all, and its
    record says so (status timeout, where it was stuck)."""
    from tunebench import watchdog

    return watchdog.watching(timeout_s, f"rank {rank}", lambda why: rundir.write_error(rank, "timeout", why))


if __name__ == "__main__":
    lean.install()
    die_with_parent()  # torchrun killed (even by SIGKILL) takes every rank with it
    with contextlib.redirect_stdout(sys.stderr):
        main(Path(sys.argv[1]))
    exit_now(0)  # written and the group destroyed: skip the interpreter's teardown (a failure raised above)
