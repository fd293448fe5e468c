"""Run one configuration, or the same per-GPU configuration at several world sizes (a scaling series)."""

from __future__ import annotations

from pathlib import Path

from tunebench.api.records import finalize
from tunebench.config import RunConfig
from tunebench.console.progress import run_progress
from tunebench.launch import Launcher, launcher_for
from tunebench.launch.isolated import Isolated
from tunebench.record import ResultRecord
from tunebench.run_preflight import preflight
from tunebench.store import check_store, held_store


def _launcher(cfg: RunConfig, given: Launcher | None, progress: bool) -> Launcher:
    """The caller's launcher; else under `run_timeout` a child process group (every rank ends at the limit);
    else this process, or torchrun when the configuration is distributed."""
    if given is not None:
        return given
    if cfg.run_timeout:
        return Isolated(cfg.run_timeout, echo=progress)
    return launcher_for(cfg, run_progress if progress else None)


def run(cfg: RunConfig, store: str | Path | None = None, *, launcher: Launcher | None = None,
        sweep_id: str | None = None, progress: bool = False) -> ResultRecord | None:
    """One configuration, checked, launched (in this process, or under torchrun when it is distributed),
    and saved to `store` if given. None only on a node whose launcher did not hold rank 0.
    `progress`: show it on stderr (torchrun's ranks always log their progress lines)."""
    plan = preflight(cfg)  # all input checks happen before any model is built or any process starts
    with held_store(store):  # checked now, and held open while the run goes on
        rec = _launcher(cfg, launcher, progress).launch(cfg, plan)
    return None if rec is None else finalize(rec, store, sweep_id)


def run_scaling(cfg: RunConfig, world_sizes: list[int], store: str | Path | None = None,
                progress: bool = False) -> list[ResultRecord]:
    """The same per-GPU configuration at each world size; the first ok run is the others' baseline."""
    configs = [cfg.model_copy(update={"nproc_per_node": n}) for n in world_sizes]
    plans = [preflight(c) for c in configs]  # every size is checked before the first one runs
    if store:
        check_store(store)
    records: list[ResultRecord] = []
    base = None
    for c, plan in zip(configs, plans):
        rec = _launcher(c, None, progress).launch(c, plan)
        if rec is None:
            continue
        if base is None and rec.status == "ok" and rec.metrics.tokens_per_s:
            base = rec
        records.append(finalize(rec, store, scaling_base=base))
    return records
