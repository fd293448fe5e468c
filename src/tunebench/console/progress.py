"""Progress of a run on stderr: a live bar on a terminal, otherwise a line every tenth of the run and at least every
half minute; a long run says how long it will take after its first steps."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

from tunebench.config import RunConfig
from tunebench.format import config_label, duration

ProgressFn = Callable[[int, float | None], None]


EXPECT_AFTER = (3, 10.0)  # the expected time is told after this many steps past the first, or seconds
QUIET_S = 30.0  # the longest a log goes without a line


class _Pace:
    """How long the run has taken and will take, from the steps after the first (which compiles and warms the
    allocator, and can take as long as many others); says once, early, when the run is long."""

    def __init__(self, steps: int):
        self.steps, self.t0, self.told = steps, time.perf_counter(), False
        self.first: float | None = None  # seconds to the end of the first step

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def mark(self, done: int) -> None:
        """After each step: the end of the first is kept."""
        if self.first is None and done >= 1:
            self.first = self.elapsed()

    def step_s(self, done: int) -> float:
        if done <= 1 or self.first is None:
            return self.elapsed() / max(done, 1)
        return (self.elapsed() - self.first) / (done - 1)

    def left(self, done: int) -> float:
        return self.step_s(done) * (self.steps - done)

    def expectation(self, done: int) -> str | None:
        """One line, once, after the first steps: the expected time of the whole run, when it is long."""
        per = self.step_s(done)
        past = done - 1, self.elapsed() - (self.first or 0.0)
        if self.told or done >= self.steps or (past[0] < EXPECT_AFTER[0] and past[1] < EXPECT_AFTER[1]):
            return None
        self.told = True
        if self.left(done) < 60:
            return None
        return (f"{self.steps:,} steps: about {duration(self.elapsed() + self.left(done))} at {per:.3g} s a step "
                f"(the first took {self.first:.3g} s); --steps sets fewer")


@contextlib.contextmanager
def run_progress(cfg: RunConfig, label: str = "") -> Iterator[ProgressFn]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    name = label or config_label(cfg.model_dump())
    console = Console(stderr=True)
    pace = _Pace(cfg.steps)
    if not console.is_terminal:  # logs (kubectl, Slurm, CI): plain lines, not a redrawn bar
        every, last = max(1, cfg.steps // 10), [0.0]

        def line(i: int, loss: float | None) -> None:
            pace.mark(i + 1)
            if (told := pace.expectation(i + 1)) is not None:
                print(f"{name}: {told}", file=sys.stderr, flush=True)
            if (i + 1) % every == 0 or i + 1 == cfg.steps or pace.elapsed() - last[0] >= QUIET_S:
                last[0] = pace.elapsed()
                shown = "" if loss is None else f" loss {loss:.4f}"
                left = f"; about {duration(pace.left(i + 1))} left" if 1 < i + 1 < cfg.steps else ""
                print(f"{name}: step {i + 1:,}/{cfg.steps:,}{shown} ({duration(pace.elapsed())}{left})",
                      file=sys.stderr, flush=True)

        yield line
        return
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("left"), TimeRemainingColumn(), TextColumn("{task.fields[loss]}"))
    with Progress(*cols, console=console, transient=True) as prog:
        task = prog.add_task(f"{name}: building", total=cfg.steps, loss="")

        def bar(i: int, loss: float | None) -> None:
            pace.mark(i + 1)
            if (told := pace.expectation(i + 1)) is not None:
                prog.console.print(f"{name}: {told}")
            phase = "warmup" if i < cfg.warmup else "timed"
            prog.update(task, completed=i + 1, description=f"{name}: {phase}",
                        loss="" if loss is None else f"loss {loss:.4f}")

        yield bar


@contextlib.contextmanager
def sweep_progress(total: int, name: Callable, summary: Callable) -> Iterator[tuple[Callable, Callable]]:
    """(on_start, on_done) callbacks for a sweep: a live bar on a terminal, a line per attempt otherwise.

    `name(attempt)` names an attempt, `summary(record)` says how it ended.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        def start(i, a):
            print(f"[{i + 1}/{total}] {name(a)} ...", file=sys.stderr, flush=True)

        def done(i, a, rec):
            print(f"[{i + 1}/{total}] {name(a)}: {summary(rec)}", file=sys.stderr, flush=True)

        yield start, done
        return
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), TextColumn("{task.fields[last]}"))
    with Progress(*cols, console=console) as prog:
        task = prog.add_task("sweep", total=total, last="")
        yield (lambda i, a: prog.update(task, description=f"[{i + 1}/{total}] {name(a)}"),
               lambda i, a, rec: prog.update(task, advance=1, last=f"last: {summary(rec)}"))
