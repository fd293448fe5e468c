"""Run a configuration in this process (strategy single, one process), with progress on stderr."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from tunebench.config import RunConfig
from tunebench.console.progress import ProgressFn, run_progress
from tunebench.record import ResultRecord
from tunebench.runner import execute, preflight


@dataclass
class InProcess:
    progress: Callable[[RunConfig], AbstractContextManager[ProgressFn]] = run_progress

    def launch(self, cfg: RunConfig) -> ResultRecord:
        started = time.perf_counter()
        plan = preflight(cfg)
        with self.progress(cfg) as progress:
            return execute(plan, progress, started)
