"""Results store: one SQLite file, WAL mode, one row per run, each row written in one transaction.

A process killed at any moment leaves either the whole row or none: SQLite's journal guarantees it,
and the record is inserted as a single statement in its own transaction. Reading is row by row: a
row this version cannot read (a newer schema, a damaged record) is skipped and counted, never fatal.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from tunebench.errors import UserError
from tunebench.record import SCHEMA_VERSION, ResultRecord

DEFAULT_STORE = Path("tunebench-results") / "results.db"

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    model TEXT,
    method TEXT,
    device TEXT,
    tokens_per_s REAL,
    config_hash TEXT,
    sweep_id TEXT,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_sweep ON results (sweep_id);
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    definition TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_hash ON results (config_hash);
CREATE TABLE IF NOT EXISTS locks (
    name TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    since TEXT NOT NULL
);
"""


def default_store_path() -> Path:
    """$TUNEBENCH_STORE (with ~ and $VARS expanded, as a shell would have), else ./tunebench-results/results.db."""
    env = os.environ.get("TUNEBENCH_STORE")
    return Path(os.path.expanduser(os.path.expandvars(env))) if env else Path(DEFAULT_STORE)


def _refuse_special(path: Path) -> None:
    if str(path) == ":memory:" or str(path).startswith("file:"):
        raise UserError(f"invalid store={path}: give a file path (an in-memory store would lose every result)")
    if path.exists() and not path.is_dir() and not path.is_file():  # a FIFO or a device: SQLite would block or fail
        raise UserError(f"invalid store={path}: not a regular file; give a database file's path")


def check_store_path(path: str | Path) -> None:
    """Check a store without creating it: an existing one is opened and write-locked; for a new one the folder
    must be creatable. (For work that refuses bad input late, so nothing is written for it.)"""
    p = Path(path)
    _refuse_special(p)
    if p.exists():
        check_store(p)
        return
    parent = next((q for q in [p.parent, *p.parent.parents] if q.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UserError(f"invalid store={p}: {parent} is not a writable folder")


def check_store(path: str | Path) -> None:
    """Open (creating it if needed) and write-lock the store now, so that a bad path fails before any work."""
    with held_store(path):
        pass


@contextlib.contextmanager
def held_store(path: str | Path | None) -> Iterator[Store | None]:
    """The store checked for writing and held open for the block (a run's whole length), or None without one."""
    if not path:
        yield None
        return
    with Store(path) as s:
        try:
            s.conn.execute("BEGIN IMMEDIATE")  # needs write access: a read-only file fails here, not at the end
            s.conn.execute("ROLLBACK")
        except sqlite3.OperationalError as err:
            raise UserError(f"invalid store={path}: cannot be written ({err})") from None
        yield s


BUSY_WAIT_S = 60.0  # how long opening a store waits for another process that holds it


def _busy(err: sqlite3.Error) -> bool:
    return "locked" in str(err) or "busy" in str(err)


def _why(err: sqlite3.Error) -> str:
    if _busy(err):
        return f"still locked by another process after {BUSY_WAIT_S:.0f} s ({err})"
    return f"not a tunebench results database ({err})"


class Store:
    """`create=False` opens only an existing store (for commands that only read)."""

    def __init__(self, path: str | Path | None = None, create: bool = True):
        self.path = Path(path) if path else default_store_path()
        self.skipped: list[str] = []  # why each unreadable row was skipped, for the caller to report
        _refuse_special(self.path)
        if self.path.is_dir():
            raise UserError(f"invalid store={str(self.path)!r}: is a directory, expected a database file")
        if not create and not self.path.is_file():
            raise UserError(f"no results store at {self.path} (give --store PATH or set TUNEBENCH_STORE)")
        if not create and self.path.stat().st_size == 0:  # an empty file: nothing to read, and not ours to fill
            raise UserError(f"invalid store={self.path}: an empty file, not a results store")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.path, timeout=60)
        except (OSError, sqlite3.Error) as err:
            raise UserError(f"invalid store={self.path}: cannot be opened ({err})") from None
        deadline = time.monotonic() + BUSY_WAIT_S
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=FULL")  # a finished result survives a power cut too
                self.conn.executescript(SCHEMA)
                return
            except sqlite3.OperationalError as err:
                # Processes opening a new store at once (two nodes, a sweep's jobs): while one switches it to WAL,
                # SQLite answers the others "locked" without waiting. They wait, then find it made.
                if _busy(err) and time.monotonic() < deadline:
                    time.sleep(0.05 + 0.1 * random.random())
                    continue
                self.conn.close()
                raise UserError(f"invalid store={self.path}: {_why(err)}") from None
            except sqlite3.DatabaseError as err:
                self.conn.close()
                raise UserError(f"invalid store={self.path}: not a tunebench results database ({err})") from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def save(self, rec: ResultRecord) -> bool:
        """Insert one record; False if a record with this id is already stored."""
        cfg = rec.config
        with self.conn:  # one transaction
            cur = self.conn.execute(
                "INSERT OR IGNORE INTO results (id, created_at, kind, status, model, method, device, tokens_per_s,"
                " config_hash, sweep_id, record) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (rec.id, rec.created_at, rec.kind, rec.status, cfg.get("model"), cfg.get("method"),
                 rec.environment.get("device"), getattr(rec.metrics, "tokens_per_s", None), rec.config_hash,
                 rec.sweep_id, rec.model_dump_json()),
            )
        return cur.rowcount == 1

    def records(self, kind: str | None = None, sweep_id: str | None = None) -> Iterator[ResultRecord]:
        """Every readable record (oldest first); unreadable rows are skipped and noted in `skipped`."""
        sql, args = "SELECT id, record FROM results WHERE 1=1", []
        if kind:
            sql, args = sql + " AND kind = ?", args + [kind]
        if sweep_id:
            sql, args = sql + " AND sweep_id = ?", args + [sweep_id]
        for rid, raw in self.conn.execute(sql + " ORDER BY created_at, rowid", args).fetchall():
            rec = self._read(rid, raw)
            if rec is not None:
                yield rec

    def _read(self, rid: str, raw: str) -> ResultRecord | None:
        try:
            return ResultRecord.model_validate_json(raw)
        except (ValidationError, ValueError, RecursionError) as err:
            self.skipped.append(f"{rid[:12]}: {unreadable_reason(raw, err)}")
            return None

    def get(self, id_prefix: str) -> ResultRecord:
        pattern = id_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.conn.execute("SELECT id, record FROM results WHERE id LIKE ? ESCAPE '\\' LIMIT 2",
                                 (pattern,)).fetchall()
        if not rows:
            raise UserError(f"no result with id {id_prefix!r} in {self.path}")
        if len(rows) > 1:
            raise UserError(f"id prefix {id_prefix!r} matches several results; give more characters")
        rec = self._read(*rows[0])
        if rec is None:
            raise UserError(f"result {rows[0][0][:12]} cannot be read: {self.skipped[-1].split(': ', 1)[1]}")
        return rec

    def save_sweep(self, sweep_id: str, name: str, created_at: str, definition: dict, replace: bool = True) -> None:
        with self.conn:
            self.conn.execute(f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO sweeps (id, name, created_at, "
                              "definition) VALUES (?,?,?,?)", (sweep_id, name, created_at, json.dumps(definition)))

    def sweeps(self) -> list[tuple[str, str, str, dict]]:
        """Every registered sweep whose definition reads: (id, name, created_at, definition); a damaged one is left
        out and named in `skipped`."""
        out = []
        for i, n, c, d in self.conn.execute("SELECT id, name, created_at, definition FROM sweeps ORDER BY created_at"):
            definition = self._definition(i, d)
            if definition is not None:
                out.append((i, n, c, definition))
        return out

    def sweep(self, sweep_id: str) -> dict:
        row = self.conn.execute("SELECT definition FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        if not row:
            raise UserError(f"no sweep with id {sweep_id!r} in {self.path}")
        definition = self._definition(sweep_id, row[0])
        if definition is None:
            raise UserError(f"sweep {sweep_id}'s definition in {self.path} is damaged: run its configurations anew "
                            "(tunebench sweep SUITE)")
        return definition

    def _definition(self, sweep_id: str, raw: str) -> dict | None:
        try:
            definition = json.loads(raw)
        except (ValueError, TypeError, RecursionError):
            definition = None
        if not isinstance(definition, dict):
            self.skipped.append(f"sweep {sweep_id}: its definition is damaged (not a JSON object)")
            return None
        return definition

    def ok_counts(self, sweep_id: str) -> dict[str, int]:
        """How many ok results each configuration (by hash) has in a sweep."""
        rows = self.conn.execute("SELECT config_hash, COUNT(*) FROM results WHERE sweep_id = ? AND status = 'ok' "
                                 "GROUP BY config_hash", (sweep_id,))
        return dict(rows.fetchall())

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]

    def integrity_check(self) -> str:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]

    def acquire(self, name: str) -> None:
        """Take the named lock (a sweep's id) for this process, or refuse: two runners of one sweep would run
        every configuration twice. A lock whose process has died on this host is taken over."""
        me = (os.getpid(), socket.gethostname())
        with self.conn:
            row = self.conn.execute("SELECT pid, host, since FROM locks WHERE name = ?", (name,)).fetchone()
            if row and (row[0], row[1]) != me and not (row[1] == me[1] and not _alive(row[0])):
                where = f"process {row[0]}" + ("" if row[1] == me[1] else f" on {row[1]}")
                raise UserError(f"{name} is being run by {where} since {row[2]}; wait for it to finish (a lock "
                                f"held on another host is released when that run ends)")
            self.conn.execute("INSERT OR REPLACE INTO locks (name, pid, host, since) VALUES (?, ?, ?, "
                              "strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))", (name, *me))

    def release(self, name: str) -> None:
        with self.conn:
            self.conn.execute("DELETE FROM locks WHERE name = ? AND pid = ? AND host = ?",
                              (name, os.getpid(), socket.gethostname()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def unreadable_reason(raw: str, err: Exception) -> str:
    """Why a stored record cannot be read, in words: most often a newer tunebench wrote it."""
    try:
        version = json.loads(raw).get("schema_version")
    except (ValueError, AttributeError, RecursionError):
        return "not a JSON record (damaged row)"
    if isinstance(version, int) and version > SCHEMA_VERSION:
        return (f"written by a newer tunebench (record schema v{version}; this version reads up to "
                f"v{SCHEMA_VERSION}): upgrade tunebench to read it")
    first = err.errors()[0] if isinstance(err, ValidationError) else None
    where = ".".join(str(p) for p in first["loc"]) if first else ""
    return f"does not match the record schema ({where}: {first['msg']})" if first else f"unreadable ({err})"


def read_exported(p: Path, skipped: list[str]) -> list[ResultRecord]:
    """Records from `results export --format jsonl` (or a JSON list): a line that is no record is refused."""
    if not p.is_file():
        raise UserError(f"results file {p} does not exist")
    text = p.read_text(errors="replace").strip()
    try:
        rows = json.loads(text) if text.startswith("[") else None
    except ValueError as err:
        raise UserError(f"results file {p} is not valid JSON ({err})") from None
    except RecursionError:
        raise UserError(f"results file {p} nests deeper than any record: not a results export") from None
    if rows is None:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except (ValueError, RecursionError):
                    raise UserError(f"results file {p}: line {n} is not a JSON record (expected one record per "
                                    "line, as `results export --format jsonl` writes)") from None
    out = []
    for n, row in enumerate(rows, 1):
        try:
            out.append(ResultRecord.model_validate(row))
        except ValidationError as err:
            try:
                why = unreadable_reason(json.dumps(row), err)
            except RecursionError:
                why = "nests deeper than any record"
            skipped.append(f"{p.name} record {n}: {why}")
        except RecursionError:
            skipped.append(f"{p.name} record {n}: nests deeper than any record")
    return out
