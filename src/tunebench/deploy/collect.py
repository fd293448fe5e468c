"""Collect result records printed between markers in logs (kubectl logs, Slurm output) into a store.

A block is a whole line ``---TUNEBENCH-RESULT-BEGIN--- sha256=<hex> bytes=<n>``, the record as one line of
JSON, and a whole line ``---TUNEBENCH-RESULT-END---``. Markers count only as whole lines, and the record
is one line of JSON (its strings' newlines escaped), so no record content can forge or end a block; the
checksum catches blocks that were cut, interleaved or altered. Every block that is not a record is counted
and described, never dropped silently.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import ValidationError

from tunebench.deploy.command import MARKER_BEGIN, MARKER_END
from tunebench.record import ResultRecord

BEGIN = re.compile(re.escape(MARKER_BEGIN) + r"(?: sha256=([0-9a-f]{64}) bytes=(\d+))?")


@dataclass
class Collected:
    records: list[ResultRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "line N: why" for each block that is not a record


def _record(body: str, head: re.Match, where: str, out: Collected) -> None:
    digest, size = head.group(1), head.group(2)
    data = body.encode()
    if not digest:  # tunebench prints every block with its checksum: one without was not printed by it
        out.skipped.append(f"{where}: a block without its checksum (sha256=... bytes=...), not read")
        return
    if int(size) != len(data) or hashlib.sha256(data).hexdigest() != digest:
        out.skipped.append(f"{where}: the block does not match its checksum (cut, interleaved or altered)")
        return
    try:
        out.records.append(ResultRecord.model_validate_json(body))
    except (ValidationError, ValueError, RecursionError) as err:
        out.skipped.append(f"{where}: not a result record ({(str(err).splitlines() or [type(err).__name__])[0]})")


def marked_records(lines: Iterable[str], name: str = "log") -> Collected:
    """Every record between a begin and an end marker line; what is not a record is counted in `skipped`."""
    out, block, head, start = Collected(), None, None, 0
    for n, line in enumerate(lines, 1):
        text = line.rstrip("\r\n")
        if (m := BEGIN.fullmatch(text)):
            if block is not None:
                out.skipped.append(f"{name} line {start}: a block with no end marker")
            block, head, start = [], m, n
        elif text == MARKER_END and block is not None:
            _record("\n".join(block), head, f"{name} line {start}", out)
            block = None
        elif block is not None:
            block.append(text)
    if block is not None:
        out.skipped.append(f"{name} line {start}: a block with no end marker (the log was cut off?)")
    return out
