"""Run one configuration, or the same per-GPU configuration at several world sizes (a scaling series)."""

from __future__ import annotations

from pathlib import Path

from tunebench.api.records import finalize
from tunebench.config import RunConfig
from tunebench.launch import Launcher, launcher_for
from tunebench.record import ResultRecord
from tunebench.runner import preflight
from tunebench.store import check_store


def run(cfg: RunConfig, store: str | Path | None = None, *, launcher: Launcher | None = None,
        sweep_id: str | None = None) -> ResultRecord | None:
    """One configuration, checked, launched (in this process, or under torchrun when it is distributed),
    and saved to `store` if given. None only on a node whose launcher did not hold rank 0."""
    preflight(cfg)  # all input checks happen before any model is built or any process starts
    if store:
        check_store(store)
    rec = (launcher or launcher_for(cfg)).launch(cfg)
    return None if rec is None else finalize(rec, store, sweep_id)


def run_scaling(cfg: RunConfig, world_sizes: list[int], store: str | Path | None = None) -> list[ResultRecord]:
    """The same per-GPU configuration at each world size; the first ok run is the others' baseline."""
    configs = [cfg.model_copy(update={"nproc_per_node": n}) for n in world_sizes]
    for c in configs:
        preflight(c)  # every size is checked before the first one runs
    if store:
        check_store(store)
    records: list[ResultRecord] = []
    base = None
    for c in configs:
        rec = launcher_for(c).launch(c)
        if rec is None:
            continue
        if base is None and rec.status == "ok" and rec.metrics.tokens_per_s:
            base = rec
        records.append(finalize(rec, store, scaling_base=base))
    return records
