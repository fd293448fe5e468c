"""Run a configuration in this process (strategy single, one process), with progress on stderr."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from tunebench.config import RunConfig
from tunebench.console import say
from tunebench.console.progress import ProgressFn
from tunebench.preflight import Plan
from tunebench.record import ResultRecord
from tunebench.run_preflight import cpu_note, preflight
from tunebench.runner import execute


@dataclass
class InProcess:
    progress: Callable[[RunConfig], AbstractContextManager[ProgressFn]] | None = None  # None: silent

    def launch(self, cfg: RunConfig, plan: Plan | None = None, inputs: dict | None = None) -> ResultRecord:
        started = time.perf_counter()
        plan = plan or preflight(cfg)
        if (self.progress or inputs is not None) and (note := cpu_note(plan)):
            say(note)
        if inputs is not None:
            from tunebench.trainer.inputs import JobInputs
            from tunebench.trainer.job import execute_train

            return execute_train(plan, JobInputs.from_json(inputs), started)
        with (self.progress or _silent)(cfg) as progress:
            return execute(plan, progress, started)


@contextlib.contextmanager
def _silent(cfg: RunConfig) -> Iterator[None]:
    yield None
