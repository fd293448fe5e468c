"""Progress of a run on stderr: a live bar on a terminal, a line every tenth of the run otherwise."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

from tunebench.config import RunConfig
from tunebench.format import config_label

ProgressFn = Callable[[int, float | None], None]


@contextlib.contextmanager
def run_progress(cfg: RunConfig, label: str = "") -> Iterator[ProgressFn]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    name = label or config_label(cfg.model_dump())
    console = Console(stderr=True)
    if not console.is_terminal:  # logs (kubectl, Slurm, CI): plain lines, not a redrawn bar
        t0, every = time.perf_counter(), max(1, cfg.steps // 10)

        def line(i: int, loss: float | None) -> None:
            if (i + 1) % every == 0 or i + 1 == cfg.steps:
                shown = "" if loss is None else f" loss {loss:.4f}"
                print(f"{name}: step {i + 1}/{cfg.steps}{shown} ({time.perf_counter() - t0:.1f} s)",
                      file=sys.stderr, flush=True)

        yield line
        return
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[loss]}"))
    with Progress(*cols, console=console, transient=True) as prog:
        task = prog.add_task(f"{name}: building", total=cfg.steps, loss="")

        def bar(i: int, loss: float | None) -> None:
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
