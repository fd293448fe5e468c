"""The run directory: how a launcher and the processes it starts hand work and results to each other.

    owner               the pid and host of the process that made it (stale directories are removed)
    job.json            the work (a config, or a command's own parameters), written by the launcher
    rank-R.json         rank R's own figures, written as soon as its loop ends
    error-rank-R.json   rank R's status and traceback if it failed
    result.json         the result, written by the process that finished the work (rank 0)

Every file is written aside and renamed into place, so a reader never sees half of one. The training
launchers, `tunebench hw`'s collectives and `tunebench load`'s preset files all use it. A directory
whose owner was killed (kill -9 leaves it behind) is removed by the next one made on that host.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunebench.files import write_text
from tunebench.record import RankFigures

PREFIX = "tunebench-run-"
PREFIXES = ("tunebench-run-", "tunebench-sweep-", "tunebench-hw-", "tunebench-load-")
ORPHAN_AGE_S = 24 * 3600  # a directory with no owner file (older versions) is stale after a day


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    @contextlib.contextmanager
    def temporary(cls, prefix: str = PREFIX) -> Iterator[RunDir]:
        """A new run directory under the temp dir, removed when the block ends however it ends."""
        clean_stale()
        path = Path(tempfile.mkdtemp(prefix=prefix))
        write_text(path / "owner", f"{os.getpid()} {socket.gethostname()}")
        try:
            yield cls(path)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def write_job(self, job: dict[str, Any]) -> None:
        write_text(self.path / "job.json", json.dumps(job))

    def job(self) -> dict[str, Any]:
        return json.loads((self.path / "job.json").read_text())

    def write_rank(self, figures: RankFigures) -> None:
        write_text(self.path / f"rank-{figures.rank}.json", figures.model_dump_json())

    def ranks(self) -> list[RankFigures]:
        return [RankFigures.model_validate_json(p.read_text()) for p in sorted(self.path.glob("rank-*.json"))]

    def write_error(self, rank: int, status: str, error: str) -> None:
        write_text(self.path / f"error-rank-{rank}.json", json.dumps({"rank": rank, "status": status,
                                                                      "error": error}))

    def errors(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.path.glob("error-rank-*.json"))]

    def write_result(self, text: str) -> None:
        write_text(self.path / "result.json", text)

    def result(self) -> str | None:
        p = self.path / "result.json"
        return p.read_text() if p.exists() else None


def _owner_gone(path: Path) -> bool:
    try:
        pid, host = (path / "owner").read_text().split()
    except (OSError, ValueError):
        return time.time() - path.stat().st_mtime > ORPHAN_AGE_S
    if host != socket.gethostname():
        return False  # a shared temp dir: only the owner's host can tell
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


def clean_stale() -> int:
    """Remove run directories whose owner has died (on this host); returns how many."""
    removed = 0
    for prefix in PREFIXES:
        for path in Path(tempfile.gettempdir()).glob(prefix + "*"):
            try:
                if path.is_dir() and _owner_gone(path):
                    shutil.rmtree(path, ignore_errors=True)
                    removed += 1
            except OSError:
                continue
    return removed
