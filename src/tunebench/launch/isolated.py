"""Run a configuration in a child process group under a time limit, as every sweep attempt runs.

The child (``python -m tunebench.launch.child RUNDIR``) runs the configuration in its own process or
under torchrun and leaves the record as RUNDIR/result.json. If it crashes or runs out its time, the
record made here says so (status failed or timeout) with the tail of its output. A child dies with
this process (and its ranks with it), so a killed sweep leaves nothing running.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from tunebench.config import RunConfig
from tunebench.environment import environment
from tunebench.launch.processes import die_with_parent, kill_group
from tunebench.launch.rundir import RunDir
from tunebench.preflight import resolve_device
from tunebench.record import ResultRecord

DEFAULT_RUN_TIMEOUT = 3600.0


def _tail(stream, keep: collections.deque) -> None:
    for line in stream:
        keep.append(line)


@dataclass
class Isolated:
    timeout: float = DEFAULT_RUN_TIMEOUT
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment

    def launch(self, cfg: RunConfig) -> ResultRecord:
        with RunDir.temporary("tunebench-sweep-") as rundir:
            rundir.write_job({"config": cfg.model_dump()})
            code, status, error, tail = self._wait(rundir)
            text = rundir.result() if status is None else None
        if text is not None:
            return ResultRecord.model_validate_json(text)
        if status is None:
            why = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            status, error = "failed", f"the run's process ended without a record ({why})"
        error = f"{error}\n--- last output ---\n{''.join(tail)[-3000:]}"
        return ResultRecord.for_config(cfg, environment(resolve_device(cfg.device)), status=status, error=error)

    def _wait(self, rundir: RunDir) -> tuple[int, str | None, str | None, collections.deque]:
        """Start the child and wait for it: (exit code, timeout status and error or None, its last stderr lines)."""
        cmd = [sys.executable, "-m", "tunebench.launch.child", str(rundir.path)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=die_with_parent, env=os.environ | self.env)
        tail: collections.deque[str] = collections.deque(maxlen=60)
        reader = threading.Thread(target=_tail, args=(proc.stderr, tail), daemon=True)
        reader.start()
        status = error = None
        try:
            proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)  # the whole group: the child, torchrun and every rank with it
            proc.wait()
            status, error = "timeout", f"exceeded the run timeout of {self.timeout:g} s; its process group was killed"
        except BaseException:  # Ctrl-C: end this attempt's processes too, then stop the sweep
            kill_group(proc.pid)
            proc.wait()
            raise
        reader.join(timeout=10)
        return proc.returncode, status, error, tail
