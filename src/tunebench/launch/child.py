"""The child of an isolated launch: ``python -m tunebench.launch.child RUNDIR``.

Reads the config from RUNDIR/job.json, runs it here or under torchrun, writes RUNDIR/result.json.
Progress goes to stderr, which the parent keeps the tail of.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path


def main(path: Path) -> int:
    from tunebench.config import RunConfig
    from tunebench.console.progress import run_progress
    from tunebench.errors import UserError
    from tunebench.launch import launcher_for
    from tunebench.launch.rundir import RunDir

    rundir = RunDir(path)
    cfg = RunConfig.model_validate(rundir.job()["config"])
    try:
        rec = launcher_for(cfg, progress=run_progress).launch(cfg)
    except UserError as err:  # refused here (the parent checked it on its machine): one line, as the CLI says it
        print(f"tunebench: error: {err}", file=sys.stderr)
        return 2
    if rec is not None:
        rundir.write_result(rec.model_dump_json())
    return 0


if __name__ == "__main__":
    from tunebench.launch import lean
    from tunebench.launch.processes import exit_now

    lean.install()
    with contextlib.redirect_stdout(sys.stderr):
        code = main(Path(sys.argv[1]))
    exit_now(code)  # the result is written: skip the interpreter's teardown
