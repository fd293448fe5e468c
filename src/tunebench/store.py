"""Results store: one SQLite file, WAL mode, one row per run, each row written in one transaction.

A process killed at any moment leaves either the whole row or none: SQLite's journal guarantees it,
and the record is inserted as a single statement in its own transaction.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from tunebench.errors import UserError
from tunebench.record import ResultRecord

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
"""


def default_store_path() -> Path:
    return Path(os.environ.get("TUNEBENCH_STORE") or DEFAULT_STORE)


def check_store(path: str | Path) -> None:
    """Open (creating it if needed) and read the store now, so that a bad path fails before any work."""
    try:
        with Store(path) as s:
            s.count()
    except sqlite3.DatabaseError as err:
        raise UserError(f"invalid store={path}: not a tunebench results database ({err})") from None
    except OSError as err:
        raise UserError(f"invalid store={path}: cannot be opened ({err.strerror or err})") from None


class Store:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_store_path()
        if self.path.exists() and self.path.is_dir():
            raise UserError(f"invalid store={str(self.path)!r}: is a directory, expected a database file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(self.path, timeout=60)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")  # a finished result survives a power cut too
        self.conn.executescript(SCHEMA)

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
                 rec.sweep_id,
                 rec.model_dump_json()),
            )
        return cur.rowcount == 1

    def records(self, kind: str | None = None, sweep_id: str | None = None) -> Iterator[ResultRecord]:
        sql, args = "SELECT record FROM results WHERE 1=1", []
        if kind:
            sql, args = sql + " AND kind = ?", args + [kind]
        if sweep_id:
            sql, args = sql + " AND sweep_id = ?", args + [sweep_id]
        for (raw,) in self.conn.execute(sql + " ORDER BY created_at, rowid", args):
            yield ResultRecord.model_validate(json.loads(raw))

    def get(self, id_prefix: str) -> ResultRecord:
        rows = self.conn.execute("SELECT record FROM results WHERE id LIKE ? || '%' LIMIT 2", (id_prefix,)).fetchall()
        if not rows:
            raise UserError(f"no result with id {id_prefix!r} in {self.path}")
        if len(rows) > 1:
            raise UserError(f"id prefix {id_prefix!r} matches several results; give more characters")
        return ResultRecord.model_validate(json.loads(rows[0][0]))

    def save_sweep(self, sweep_id: str, name: str, created_at: str, definition: dict) -> None:
        with self.conn:
            self.conn.execute("INSERT OR REPLACE INTO sweeps (id, name, created_at, definition) VALUES (?,?,?,?)",
                              (sweep_id, name, created_at, json.dumps(definition)))

    def sweep(self, sweep_id: str) -> dict:
        row = self.conn.execute("SELECT definition FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        if not row:
            raise UserError(f"no sweep with id {sweep_id!r} in {self.path}")
        return json.loads(row[0])

    def ok_counts(self, sweep_id: str) -> dict[str, int]:
        """How many ok results each configuration (by hash) has in a sweep."""
        rows = self.conn.execute("SELECT config_hash, COUNT(*) FROM results WHERE sweep_id = ? AND status = 'ok' "
                                 "GROUP BY config_hash", (sweep_id,))
        return dict(rows.fetchall())

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]

    def integrity_check(self) -> str:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]
