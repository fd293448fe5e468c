"""Local data files, row by row: JSONL/JSON, CSV and text read here with the standard library, Parquet with
pyarrow, a folder written by `save_to_disk` with datasets; a folder of files of one format. Nothing is ever
fetched from a hub.

JSON, CSV and text are read here rather than by `datasets.load_dataset` for what it cannot say or do: it
reports a byte that is not UTF-8 at "position 0" of some chunk, a malformed JSON line as "row 1" of a block,
blocks forever on a FIFO, calls a symlink loop missing, turns a CSV column of numbers into floats ("2" trains
as "2.0"), and fails (or makes an untyped Json column) where a field is a string in some rows and a number or
null in others. Here every row comes with where it is ("line 12"), every unreadable file says why, and each
row is a plain Python value for validate.py to judge. Rows are streamed; a .json file holding one array is
parsed whole.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunebench.errors import UserError

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text", ".md": "text",
           ".py": "text"}
Row = tuple[str, Any]  # (where, the row)


class FileFault(Exception):
    """Why one file cannot be read, in words (turned into a UserError that names the data)."""


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "state.json").is_file()
                              or (path / "dataset_dict.json").is_file())


def _not_regular(mode: int) -> str | None:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else "not a file"


def _stat(path: Path) -> os.stat_result:
    """The path's stat, or a FileFault that says why there is none (missing, a broken link, a loop)."""
    try:
        return path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise FileFault(f"a symlink to {os.readlink(path)}, which does not exist") from None
        raise FileFault("does not exist") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise FileFault("a symlink loop (following its links never reaches a file)") from None
        raise FileFault(f"cannot be read ({err.strerror})") from None


def _checked(path: Path, in_folder: bool) -> None:
    """Refuse what is not a regular file before opening it: opening a FIFO waits for a writer forever."""
    st = _stat(path)
    other = _not_regular(st.st_mode)
    if other:
        raise FileFault(f"not a regular file: {other}")
    if st.st_size == 0 and not in_folder:
        raise FileFault("the file is empty")
    if not os.access(path, os.R_OK):
        raise FileFault("cannot be read (permission denied)")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file, a byte-order mark dropped; a byte that is not UTF-8 is named by
    its offset in the file."""
    at = 0
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below; a generator's with-block reads the same)
    except OSError as err:
        raise FileFault(f"cannot be opened ({err.strerror})") from None
    with f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise FileFault(f"not UTF-8 text: byte {at + err.start:,} (0x{raw[err.start]:02x}, line {n}) is not "
                                "UTF-8; save the file as UTF-8") from None
            at += len(raw)
            yield n, line[1:] if n == 1 and line.startswith("\ufeff") else line


def _jsonl(path: Path) -> Iterator[Row]:
    for n, line in _lines(path):
        if line.strip():
            try:
                yield f"line {n}", json.loads(line)
            except json.JSONDecodeError as err:
                raise FileFault(f"malformed JSON on line {n} (column {err.colno}: {err.msg})") from None
            except RecursionError:
                raise FileFault(f"line {n} nests its JSON too deeply to be read") from None


def _json(path: Path) -> Iterator[Row]:
    """A .json file: one array of rows (parsed whole), one object (one row), or JSON Lines."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise FileFault(f"cannot be opened ({err.strerror})") from None
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise FileFault(f"not UTF-8 text: byte {err.start:,} (0x{raw[err.start]:02x}, line {line}) is not UTF-8; "
                        "save the file as UTF-8") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # more than one value: one object per line
            yield from _jsonl(path)
            return
        raise FileFault(f"malformed JSON on line {err.lineno} (column {err.colno}: {err.msg})") from None
    except RecursionError:
        raise FileFault("nests its JSON too deeply to be read") from None
    if isinstance(value, list):
        yield from ((f"item {i}", v) for i, v in enumerate(value, 1))
    elif isinstance(value, dict):
        yield "line 1", value
    else:
        raise FileFault("holds one JSON value, not rows (give an array of objects, or one object per line)")


@contextlib.contextmanager
def _big_fields() -> Iterator[None]:
    """CSV fields as long as a document (the csv module stops at 128 KiB by default)."""
    old = csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _csv(path: Path) -> Iterator[Row]:
    """Rows as {header: cell}, every cell a string (an empty cell is ""); a short row lacks the last fields."""
    reader = csv.reader((line for _, line in _lines(path)), strict=True)  # a stray quote is an error, not text
    try:
        with _big_fields():
            header = next(reader, None) or []
            for cells in reader:
                if cells:
                    yield f"line {reader.line_num}", dict(zip(header, cells))
    except csv.Error as err:
        raise FileFault(f"malformed CSV on line {reader.line_num} ({err})") from None


def _text(path: Path) -> Iterator[Row]:
    for n, line in _lines(path):
        yield f"line {n}", {"text": line.rstrip("\r\n")}


def _parquet(path: Path) -> Iterator[Row]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow's own error types; the first line says it
        raise FileFault(f"not a Parquet file ({_first_line(err)})") from None
    n, batches = 0, pf.iter_batches(batch_size=1024)
    while True:
        try:
            batch = next(batches, None)
        except Exception as err:  # a damaged page
            raise FileFault(f"a damaged Parquet file after row {n:,} ({_first_line(err)})") from None
        if batch is None:
            return
        for row in batch.to_pylist():
            n += 1
            yield f"row {n}", row


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


READERS = {"csv": _csv, "text": _text, "parquet": _parquet}


@dataclass
class Source:
    """Data as given (`data`), its format and files; rows() streams (where, row) in file and row order."""

    data: str
    what: str
    kind: str  # json, csv, text, parquet, saved (a save_to_disk folder)
    root: Path
    files: list[Path] = field(default_factory=list)
    _saved: Any = None

    def _refuse(self, path: Path | None, why: str) -> UserError:
        where = f"{path.relative_to(self.root)}: " if path is not None and path != self.root else ""
        return UserError(f"invalid {self.what}={self.data}: {where}{why}")

    def rows(self) -> Iterator[Row]:
        if self.kind == "saved":
            yield from ((f"row {i}", r) for i, r in enumerate(self.saved(), 1))
            return
        for path in self.files:
            prefix = f"{path.relative_to(self.root)} " if path != self.root else ""
            reader = _json if self.kind == "json" and path.suffix == ".json" else \
                _jsonl if self.kind == "json" else READERS[self.kind]
            try:
                for where, row in reader(path):
                    yield prefix + where, row
            except FileFault as err:
                raise self._refuse(path, str(err)) from None

    def saved(self):
        """The save_to_disk dataset (its split 'train' if it is a DatasetDict)."""
        if self._saved is None:
            import datasets

            try:
                ds = datasets.load_from_disk(str(self.root))
            except Exception as err:  # a folder that only looks like one
                raise self._refuse(None, f"cannot be read as a saved dataset ({_first_line(err)})") from None
            if isinstance(ds, datasets.DatasetDict):
                ds = ds["train"] if "train" in ds else next(iter(ds.values()))
            self._saved = ds
        return self._saved

    def signature(self) -> str:
        """What the rows depend on: every file's name and bytes (the saved dataset's own fingerprint)."""
        h = hashlib.sha256()
        if self.kind == "saved":
            h.update(self.saved()._fingerprint.encode())
        for path in self.files:
            h.update(f"{path.relative_to(self.root) if path != self.root else path.name}\0".encode())
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()


def open_source(data: str, what: str = "data") -> Source:
    """The source at `data`, its paths checked (nothing read yet): a file, a folder of one format's files,
    or a save_to_disk folder."""
    path = Path(data).expanduser()
    try:
        st = _stat(path)
        if _is_saved_dataset(path):
            return Source(data, what, "saved", path)
        if not stat.S_ISDIR(st.st_mode):
            _checked(path, in_folder=False)
            kind = FORMATS.get(path.suffix)
            if kind is None:
                raise FileFault(f"{path.suffix or 'no extension'} is not a data file format "
                                f"({', '.join(sorted(FORMATS))})")
            return Source(data, what, kind, path, [path])
    except FileFault as err:
        raise UserError(f"invalid {what}={data}: {err}") from None
    return _folder(data, what, path)


def _folder(data: str, what: str, path: Path) -> Source:
    found = sorted(p for p in path.rglob("*") if p.suffix in FORMATS and not p.is_dir())
    for p in found:  # a FIFO, a device or a dangling link among the files is named, not skipped
        try:
            _checked(p, in_folder=True)
        except FileFault as err:
            raise UserError(f"invalid {what}={data}: {p.relative_to(path)}: {err}") from None
    if not found:
        raise UserError(f"invalid {what}={data}: no data files in it ({', '.join(sorted(FORMATS))})")
    kinds = sorted({FORMATS[p.suffix] for p in found})
    if len(kinds) > 1:
        raise UserError(f"invalid {what}={data}: the folder mixes formats ({', '.join(kinds)}); keep one")
    return Source(data, what, kinds[0], path, found)
