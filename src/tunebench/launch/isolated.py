"""Run a configuration in a child process group under a time limit, as every sweep attempt runs.

The child (``python -m tunebench.launch.child RUNDIR``) runs the configuration in its own process or
under torchrun and leaves the record as RUNDIR/result.json. If it crashes or runs out its time, the
record made here says so (status failed or timeout) with the tail of its output. A child dies with
this process (and its ranks with it), so a killed sweep leaves nothing running.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from tunebench.config import RunConfig
from tunebench.environment import environment
from tunebench.launch.processes import run_group
from tunebench.launch.rundir import RunDir
from tunebench.preflight import resolve_device
from tunebench.record import ResultRecord

DEFAULT_RUN_TIMEOUT = 3600.0


@dataclass
class Isolated:
    timeout: float = DEFAULT_RUN_TIMEOUT
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    echo: bool | Callable[[str], bool] = False  # the child's output on stderr as it comes (or the lines it accepts)

    def launch(self, cfg: RunConfig, plan=None, inputs: dict | None = None) -> ResultRecord:
        with RunDir.temporary("tunebench-sweep-") as rundir:
            rundir.write_job({"config": cfg.model_dump()})
            done = run_group([sys.executable, "-m", "tunebench.launch.child", str(rundir.path)],
                             os.environ | self.env, self.timeout, self.echo, keep=60)
            text = None if done.timed_out else rundir.result()
        if text is not None:
            return ResultRecord.model_validate_json(text)
        if done.timed_out:
            status, error = "timeout", f"exceeded the run timeout of {self.timeout:g} s; its process group was killed"
        else:
            why = f"killed by signal {signal.Signals(-done.code).name}" if done.code < 0 else f"exit code {done.code}"
            status, error = "failed", f"the run's process ended without a record ({why})"
        error = f"{error}\n--- last output ---\n{''.join(done.tail)[-3000:]}"
        return ResultRecord.for_config(cfg, environment(resolve_device(cfg.device)), status=status, error=error)
