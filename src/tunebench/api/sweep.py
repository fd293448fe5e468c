"""Sweeps: a suite's configurations, each run in its own process under a time limit, resumably.

A sweep is registered in the store with every configuration in full before its first run. Each
attempt's record is saved the moment it finishes; after Ctrl-C or a killed sweep, `resume` plans
only what has fewer ok results than the repeats asked for (configurations matched by hash).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tunebench.api.records import finalize
from tunebench.config import RunConfig
from tunebench.errors import UserError
from tunebench.launch.isolated import DEFAULT_RUN_TIMEOUT, Isolated
from tunebench.record import ResultRecord
from tunebench.run_preflight import preflight
from tunebench.store import Store, check_store
from tunebench.suites import Entry, definition, expand, from_definition, load_suite


@dataclass(frozen=True)
class Attempt:
    entry: Entry
    repeat: int  # 0-based index among this configuration's repeats


@dataclass(frozen=True)
class SweepPlan:
    id: str
    name: str
    entries: list[Entry]
    repeats: int


def new_sweep_id(name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{''.join(c if c.isalnum() else '-' for c in name)[:24]}-{stamp}-{secrets.token_hex(2)}"


def plan_sweep(suite: str, sets: dict[str, Any] | None = None, repeats: int | None = None) -> SweepPlan:
    """A new sweep of a suite (built-in name or YAML file), expanded and validated; nothing runs or is stored."""
    data = load_suite(suite)
    name = str(data.get("name") or Path(suite).stem)
    return SweepPlan(new_sweep_id(name), name, expand(data, sets), _repeats(repeats, 1))


def resume_plan(store: str | Path, sweep_id: str, repeats: int | None = None) -> SweepPlan:
    """A registered sweep, as it was defined (the repeats may be raised)."""
    if not Path(store).is_file():
        raise UserError(f"no sweep with id {sweep_id!r} in {store}: there is no results store there")
    with Store(store, create=False) as s:
        name, entries, registered = from_definition(s.sweep(sweep_id))
    return SweepPlan(sweep_id, name, entries, _repeats(repeats, registered))


def _repeats(asked: int | None, default: int) -> int:
    n = default if asked is None else asked
    if n < 1:
        raise UserError(f"invalid repeats={n}: must be at least 1")
    return n


def refusals(plan: SweepPlan) -> dict[str, str]:
    """Each configuration's refusal on this machine (entry name -> why), as the real sweep would check it."""
    out = {}
    for e in plan.entries:
        try:
            preflight(e.config)
        except UserError as err:
            out[e.name] = str(err)
    return out


def check_sweep(plan: SweepPlan) -> None:
    """Every configuration is checked before the first one runs."""
    refused = refusals(plan)
    if refused:
        name, why = next(iter(refused.items()))
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise UserError(f"suite entry '{name}': {why}{more}")


def pending(store: str | Path, plan: SweepPlan) -> list[Attempt]:
    """What the sweep still has to run: repeats minus the ok results already stored."""
    with Store(store) as s:
        done = s.ok_counts(plan.id)
    return [Attempt(e, k) for e in plan.entries for k in range(done.get(e.config.config_hash(), 0), plan.repeats)]


@contextlib.contextmanager
def sweep_lock(store: str | Path, sweep_id: str) -> Iterator[None]:
    """Hold the sweep's lock in the store while it runs (UserError if a live process holds it)."""
    with Store(store) as s:
        s.acquire(f"sweep {sweep_id}")
    try:
        yield
    finally:
        with Store(store) as s:
            s.release(f"sweep {sweep_id}")


def register(store: str | Path, plan: SweepPlan) -> None:
    check_store(store)
    with Store(store) as s:
        s.save_sweep(plan.id, plan.name, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     definition(plan.name, plan.entries, plan.repeats))


def run_sweep(plan: SweepPlan, store: str | Path, attempts: list[Attempt], timeout: float = DEFAULT_RUN_TIMEOUT,
              on_start: Callable[[int, Attempt], None] | None = None,
              on_done: Callable[[int, Attempt, ResultRecord], None] | None = None) -> list[ResultRecord]:
    """Each attempt in its own process group under `timeout`; each record saved as soon as it exists."""
    check_store(store)
    records = []
    for i, attempt in enumerate(attempts):
        if on_start:
            on_start(i, attempt)
        cfg = attempt.entry.config
        rec = finalize(Isolated(cfg.run_timeout or timeout).launch(cfg), store, plan.id)
        records.append(rec)
        if on_done:
            on_done(i, attempt, rec)
    return records


def run_each_gpu(cfg: RunConfig, gpus: int, store: str | Path, timeout: float = DEFAULT_RUN_TIMEOUT,
                 on_start: Callable[[int], None] | None = None,
                 on_done: Callable[[int, ResultRecord], None] | None = None) -> list[ResultRecord]:
    """The same configuration on each local GPU in turn (one sweep), for consistency checks."""
    preflight(cfg)
    check_store(store)
    sweep_id = new_sweep_id("consistency")
    records = []
    for i in range(gpus):
        if on_start:
            on_start(i)
        rec = finalize(Isolated(timeout, {"CUDA_VISIBLE_DEVICES": str(i)}).launch(cfg), store, sweep_id)
        records.append(rec)
        if on_done:
            on_done(i, rec)
    return records


def sweep_records(store: str | Path, plan: SweepPlan) -> tuple[list[ResultRecord], bool]:
    """The sweep's stored records, and whether every configuration has all its ok results."""
    with Store(store) as s:
        records = list(s.records(sweep_id=plan.id))
    return records, not pending(store, plan)


def task_index(index: str | None) -> int:
    """A deployed task's index: given, or auto from the platform (Kubernetes Indexed Job, Slurm array)."""
    import os

    if index in (None, "auto"):
        index = os.environ.get("JOB_COMPLETION_INDEX") or os.environ.get("SLURM_ARRAY_TASK_ID")
        if index is None:
            raise UserError("invalid index=auto: neither JOB_COMPLETION_INDEX nor SLURM_ARRAY_TASK_ID is set")
    if not str(index).isdigit():
        raise UserError(f"invalid index={index}: a task index is a number from 0")
    return int(index)


def run_task(definition: dict[str, Any], index: int, group: str | None, store: str | Path,
             timeout: float = DEFAULT_RUN_TIMEOUT) -> ResultRecord:
    """One task of a deployed sweep: its configuration run in its own process group, stored with the sweep's id
    (and the sweep's definition beside it, so that merged stores assemble the sweep)."""
    positions = definition["groups"].get(str(group)) if group is not None else list(range(len(definition["tasks"])))
    if positions is None or index >= len(positions):
        raise UserError(f"invalid index={index}: the sweep has {len(positions or [])} tasks"
                        + (f" for {group} GPUs" if group is not None else ""))
    e, _ = definition["tasks"][positions[index]]
    cfg = RunConfig.model_validate(definition["entries"][e]["config"])
    check_store(store)
    with Store(store) as s:
        s.save_sweep(definition["sweep_id"], definition["name"], datetime.now(timezone.utc).isoformat(
            timespec="seconds"), {k: definition[k] for k in ("name", "repeats", "entries")})
    return finalize(Isolated(cfg.run_timeout or timeout).launch(cfg), store, definition["sweep_id"])
