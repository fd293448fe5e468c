"""Run a list of configurations, each in its own process under a timeout, storing each result at once.

Every attempt gets its record id before it starts. The child (``tunebench run``, which itself uses
torchrun when the configuration is distributed) stores its record under that id; if the child
crashes or runs out its time, this process stores a ``failed`` or ``timeout`` record under the same
id. Either way one attempt is one row, and a sweep that is killed keeps every finished row:
``--resume`` then runs only what has fewer ``ok`` results than asked for.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import yaml

from tunebench.config import RunConfig
from tunebench.environment import environment
from tunebench.launch.torchrun import die_with_parent
from tunebench.record import ResultRecord
from tunebench.runner import resolve_device
from tunebench.store import Store
from tunebench.suites import Entry

DEFAULT_RUN_TIMEOUT = 3600.0


@dataclass(frozen=True)
class Attempt:
    entry: Entry
    repeat: int  # 0-based index among this configuration's repeats


def new_sweep_id(name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{''.join(c if c.isalnum() else '-' for c in name)[:24]}-{stamp}-{secrets.token_hex(2)}"


def register(store: Store, sweep_id: str, name: str, entries: list[Entry], repeats: int) -> None:
    definition = {"name": name, "repeats": repeats,
                  "entries": [{"name": e.name, "config": e.config.model_dump()} for e in entries]}
    store.save_sweep(sweep_id, name, datetime.now(timezone.utc).isoformat(timespec="seconds"), definition)


def registered_entries(store: Store, sweep_id: str) -> tuple[str, list[Entry], int]:
    d = store.sweep(sweep_id)
    entries = [Entry(e["name"], RunConfig.model_validate(e["config"])) for e in d["entries"]]
    return d["name"], entries, d["repeats"]


def pending(store: Store, sweep_id: str, entries: list[Entry], repeats: int) -> list[Attempt]:
    """What a (resumed) sweep still has to run: repeats minus the ok results already stored."""
    done = store.ok_counts(sweep_id)
    return [Attempt(e, k) for e in entries for k in range(done.get(e.config.config_hash(), 0), repeats)]


def _tail(stream, keep: collections.deque) -> None:
    for line in stream:
        keep.append(line)


def run_isolated(cfg: RunConfig, store_path: Path, sweep_id: str, timeout: float,
                 env: dict[str, str] | None = None) -> ResultRecord:
    """One attempt in a child process group; the record is stored exactly once, whoever writes it."""
    record_id = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="tunebench-sweep-") as tmp:
        cfg_file = Path(tmp) / "run.yaml"
        cfg_file.write_text(yaml.safe_dump(cfg.model_dump()))
        cmd = [sys.executable, "-m", "tunebench.cli", "run", str(cfg_file), "--json", "--store", str(store_path),
               "--sweep-id", sweep_id, "--record-id", record_id]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=die_with_parent, env=os.environ | (env or {}))
        err_tail: collections.deque[str] = collections.deque(maxlen=60)
        out_lines: list[str] = []
        readers = [threading.Thread(target=_tail, args=(proc.stderr, err_tail), daemon=True),
                   threading.Thread(target=_tail, args=(proc.stdout, out_lines), daemon=True)]
        for r in readers:
            r.start()
        status, error = None, None
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: torchrun and every rank with it
            proc.wait()
            status, error = "timeout", f"exceeded the run timeout of {timeout:g} s; its process group was killed"
        except BaseException:  # Ctrl-C: end this attempt's processes too, then stop the sweep
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        for r in readers:
            r.join(timeout=10)
    rec = _parse("".join(out_lines)) if status is None else None
    if rec is None:
        if status is None:
            code = proc.returncode
            why = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            status, error = "failed", f"the run's process ended without a record ({why})"
        error = f"{error}\n--- last output ---\n{''.join(err_tail)[-3000:]}"
        rec = ResultRecord(id=record_id, config=cfg.model_dump(), config_hash=cfg.config_hash(),
                           environment=environment(resolve_device(cfg.device)), tags=cfg.tag, status=status, error=error,
                           sweep_id=sweep_id)
    with Store(store_path) as store:
        store.save(rec)  # a no-op when the child already stored this id
    return rec


def _parse(out: str) -> ResultRecord | None:
    start = out.find("{")
    if start < 0:
        return None
    try:
        return ResultRecord.model_validate(json.loads(out[start:]))
    except (ValueError, TypeError):
        return None


def run_sweep(attempts: list[Attempt], store_path: Path, sweep_id: str, timeout: float,
              on_done: Callable[[int, Attempt, ResultRecord], None] | None = None,
              on_start: Callable[[int, Attempt], None] | None = None) -> list[ResultRecord]:
    records = []
    for i, attempt in enumerate(attempts):
        if on_start:
            on_start(i, attempt)
        rec = run_isolated(attempt.entry.config, store_path, sweep_id, timeout)
        records.append(rec)
        if on_done:
            on_done(i, attempt, rec)
    return records
