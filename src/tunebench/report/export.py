"""Records as tables: CSV and Parquet (one flat row per record), and JSON lines; written aside, then renamed."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TextIO

from tunebench.errors import UserError
from tunebench.files import written_aside
from tunebench.record import ResultRecord, flat_row


def write_csv(records: list[ResultRecord], out: TextIO) -> None:
    rows = [flat_row(r) for r in records]
    w = csv.DictWriter(out, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
    w.writeheader()
    w.writerows(rows)


def write_jsonl(records: list[ResultRecord], out: TextIO) -> None:
    for r in records:
        out.write(r.model_dump_json() + "\n")


def _parquet_safe(rows: list[dict]) -> list[dict]:
    """One type per column: numbers become floats where a column mixes ints and floats, else text."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    for c in cols:
        kinds = {type(r.get(c)) for r in rows} - {type(None)}
        if kinds <= {int, float} and float in kinds:
            for r in rows:
                r[c] = None if r.get(c) is None else float(r[c])
        elif len(kinds) > 1:
            for r in rows:
                r[c] = None if r.get(c) is None else str(r[c])
    return [{c: r.get(c) for c in cols} for r in rows]


def write_parquet(records: list[ResultRecord], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with written_aside(path) as tmp:
        pq.write_table(pa.Table.from_pylist(_parquet_safe([flat_row(r) for r in records])), tmp)


def check_destination(path: Path) -> None:
    if path.is_dir():
        raise UserError(f"invalid output={path}: is a folder; give a file name")
    if not path.parent.is_dir():
        raise UserError(f"invalid output={path}: the folder {path.parent} does not exist")


def export(records: list[ResultRecord], path: Path, fmt: str) -> None:
    """Write `records` to `path` as csv or jsonl: the file appears only once it is complete."""
    check_destination(path)
    with written_aside(path) as tmp:
        with open(tmp, "w", newline="") as f:
            (write_jsonl if fmt == "jsonl" else write_csv)(records, f)
