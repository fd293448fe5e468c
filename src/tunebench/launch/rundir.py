"""The run directory: how a launcher and the processes it starts hand work and results to each other.

    job.json            the work (a config, or a command's own parameters), written by the launcher
    rank-R.json         rank R's own figures, written as soon as its loop ends
    error-rank-R.json   rank R's status and traceback if it failed
    result.json         the result, written by the process that finished the work (rank 0)

Every file is written aside and renamed into place, so a reader never sees half of one. Both the
training launchers and `tunebench hw`'s collectives use it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunebench.files import write_text
from tunebench.record import RankFigures

PREFIX = "tunebench-run-"


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    @contextlib.contextmanager
    def temporary(cls, prefix: str = PREFIX) -> Iterator[RunDir]:
        """A new run directory under the temp dir, removed when the block ends however it ends."""
        path = Path(tempfile.mkdtemp(prefix=prefix))
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
