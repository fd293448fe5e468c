"""The rows of a data source that can train, as a `datasets.Dataset`: read (files.py), checked and counted
(validate.py), the damaged ones dropped or refused.

One pass reads every row, checks it against each shape it could be (the shape is decided by the fields of all
rows, known only at the end) and counts the damaged ones by reason. The rows kept are then written by
`Dataset.from_generator` (a second pass, skipped when `datasets` has those rows from an earlier run) as fixed
string columns, so no column's type is ever inferred from mixed values. The dataset's fingerprint is the
source's bytes (hashed apart), the shape, the fields and the checks' version: the same file gives the same
fingerprint in every run and with every `datasets` version, and any change to its bytes gives another.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from tunebench.data import examples, files
from tunebench.data.validate import SHAPES, VERSION, Fields, Tally, enforce, kept, problem
from tunebench.errors import UserError

COLUMNS = {"text": ["text"], "pairs": ["prompt", "completion"], "chat": ["messages", "tools"],
           "preference": ["prompt", "chosen", "rejected", "tools"]}


@dataclass
class Checked:
    ds: object  # datasets.Dataset: the columns of COLUMNS[shape] and `_row` (where the row is, "line 12")
    shape: str
    tally: Tally


def _kept_rows(data: str, what: str, shape: str, fields: str, signature: str, version: int):
    """The rows that pass the checks, as kept() writes them (a module function: `datasets` hashes it and its
    arguments, the source's signature among them, to name the rows it keeps on disk)."""
    f = Fields(*json.loads(fields))
    for where, row in files.open_source(data, what).rows():
        if problem(row, shape, f) is None:
            yield {**kept(row, shape, f), "_row": where}


def read(cfg, data: str, what: str, cache: Path) -> Checked:
    """The rows of `data` that can train; refuses (UserError) damaged rows as strict_data and max_bad_rows ask."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before datasets is imported (a saved dataset imports it)
    src = files.open_source(data, what)
    fields = Fields.of(cfg)
    shapes = [cfg.data_format] if cfg.data_format != "auto" else list(SHAPES)
    tallies = {s: Tally() for s in shapes}
    columns: dict[str, None] = {}
    for where, row in src.rows():
        if isinstance(row, dict):
            columns.update(dict.fromkeys(row))
        for shape, tally in tallies.items():
            tally.read += 1
            reason = problem(row, shape, fields)
            if reason:
                tally.add(reason, where)
                if cfg.strict_data and len(shapes) == 1:  # the shape is known: the first damaged row refuses
                    enforce(tally, cfg, what, data)
    read_rows = next(iter(tallies.values())).read
    if read_rows == 0:
        raise UserError(f"invalid {what}={data}: holds no rows")
    shape = examples.detect(list(columns), cfg)
    tally = tallies[shape]
    enforce(tally, cfg, what, data)
    if tally.damaged == read_rows:
        raise UserError(f"invalid {what}={data}: every one of its {read_rows:,} rows is damaged ({tally.summary()})")
    return Checked(_dataset(src, shape, fields, cache), shape, tally)


def _dataset(src: files.Source, shape: str, fields: Fields, cache: Path):
    import datasets

    datasets.disable_progress_bars()  # reading local rows takes seconds; tokenizing has its own progress
    signature = src.signature()
    features = datasets.Features({c: datasets.Value("string") for c in [*COLUMNS[shape], "_row"]})
    kwargs = {"data": src.data, "what": src.what, "shape": shape, "fields": json.dumps(list(fields)),
              "signature": signature, "version": VERSION}
    ds = datasets.Dataset.from_generator(_kept_rows, features=features, gen_kwargs=kwargs, cache_dir=str(cache))
    ds._fingerprint = hashlib.sha256(json.dumps(["rows", VERSION, signature, shape, list(fields)]).encode()) \
        .hexdigest()[:16]
    return ds
