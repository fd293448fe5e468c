"""Consistency: one configuration's results on several GPUs or nodes, measured here or read from the store."""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

from tunebench.api.sweep import run_each_gpu
from tunebench.config import RunConfig
from tunebench.errors import UserError
from tunebench.launch.isolated import DEFAULT_RUN_TIMEOUT
from tunebench.record import ResultRecord
from tunebench.report.consistency import Consistency, analyse
from tunebench.store import Store


def _ok(recs: list[ResultRecord]) -> list[ResultRecord]:
    return [r for r in recs if r.status == "ok" and r.metrics.tokens_per_s]


def stored(store: str | Path, sweep: str | None = None, tag: str | None = None) -> tuple[Consistency, list[str]]:
    """The ok runs of a sweep (or with a tag), of the configuration run most often; and the unreadable rows."""
    with Store(store, create=False) as s:
        recs = [r for r in _ok(list(s.records("train", sweep))) if not tag or tag in r.tags]
    groups = collections.Counter(r.config_hash for r in recs)
    if not groups:
        raise UserError("no ok results match: nothing to compare")
    main_hash = groups.most_common(1)[0][0]
    return _analysed([r for r in recs if r.config_hash == main_hash]), s.skipped


def measured(cfg: RunConfig, store: str | Path, on_start: Callable[[int, int], None] | None = None,
             on_done: Callable[[int, int, ResultRecord], None] | None = None) -> Consistency:
    """The same configuration on each local GPU in turn, each in its own process."""
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise UserError("no GPU is visible: compare stored runs from several nodes with --sweep or --with-tag")
    recs = run_each_gpu(cfg.model_copy(update={"device": "cuda"}), gpus, store, cfg.run_timeout or DEFAULT_RUN_TIMEOUT,
                        on_start=on_start and (lambda i: on_start(i, gpus)),
                        on_done=on_done and (lambda i, r: on_done(i, gpus, r)))
    return _analysed(_ok(recs))


def _analysed(recs: list[ResultRecord]) -> Consistency:
    if len(recs) < 2:
        raise UserError(f"consistency needs at least 2 ok runs of one configuration, found {len(recs)}")
    return analyse(recs)
