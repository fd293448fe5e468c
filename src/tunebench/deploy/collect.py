"""Collect result records printed between markers in logs (kubectl logs, Slurm output) into a store."""

from __future__ import annotations

from collections.abc import Iterable

from tunebench.deploy.command import MARKER_BEGIN, MARKER_END
from tunebench.record import ResultRecord


def marked_records(lines: Iterable[str]) -> list[ResultRecord]:
    """Every record between a begin and an end marker; partial or broken blocks are skipped."""
    out, block = [], None
    for line in lines:
        text = line.rstrip("\n")
        if MARKER_BEGIN in text:
            block = []
        elif MARKER_END in text and block is not None:
            try:
                out.append(ResultRecord.model_validate_json("\n".join(block)))
            except ValueError:
                pass  # a block cut by a crash or a log rotation: not a record
            block = None
        elif block is not None:
            block.append(text)
    return out
