"""The one place results enter the store: `finalize` for new results, `import_records` for collected ones.

A result that cannot be saved is never lost: it is written as JSON beside the store (or in the
current directory) and its path is printed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from tunebench.api.plan import prediction_for
from tunebench.files import write_text
from tunebench.record import ResultRecord, Scaling
from tunebench.store import Store


def scaling_against(rec: ResultRecord, base: ResultRecord) -> Scaling | None:
    """Speedup and efficiency of `rec` against the first ok run of its scaling series (itself, possibly)."""
    m, b = rec.metrics, base.metrics
    if not m.tokens_per_s or not b.tokens_per_s:
        return None
    speedup = m.tokens_per_s / b.tokens_per_s
    return Scaling(baseline_id=base.id, baseline_world_size=b.world_size, speedup=speedup,
                   efficiency=speedup * b.world_size / m.world_size)


def finalize(rec: ResultRecord, store: str | Path | None, sweep_id: str | None = None,
             scaling_base: ResultRecord | None = None) -> ResultRecord:
    """Stamp what the run's caller knows (its sweep, its scaling baseline), then save it once.
    `rec.saved_to` then names the store; None means it was kept aside instead (and said so)."""
    if sweep_id:
        rec.sweep_id = sweep_id
    if scaling_base is not None and rec.kind == "train":
        rec.metrics.scaling = scaling_against(rec, scaling_base)
    if rec.kind == "train" and rec.metrics.predicted is None:
        rec.metrics.predicted = prediction_for(rec, store)
    if store:
        _save(rec, Path(store))
    return rec


def import_records(records: Iterable[ResultRecord], store: str | Path,
                   sweeps: Iterable[tuple[str, str, str, dict]] = ()) -> tuple[int, int]:
    """Records made elsewhere (other nodes' stores, logs) into `store`, with the definitions of their sweeps
    (one already there is kept): (how many records, how many were new)."""
    found = new = 0
    with Store(store) as s:
        for sweep in sweeps:
            s.save_sweep(*sweep, replace=False)
        for rec in records:
            found += 1
            new += s.save(rec)
    return found, new


def _save(rec: ResultRecord, store: Path) -> None:
    try:
        with Store(store) as s:
            s.save(rec)
        rec._saved_to = str(store)
    except Exception as err:  # the run happened: keep its result whatever the store's problem
        kept = _keep_aside(rec, store)
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"tunebench: could not save result {rec.id} to {store} ({why}); kept it as {kept}", file=sys.stderr)
        print(rec.model_dump_json(), file=sys.stderr)


def _keep_aside(rec: ResultRecord, store: Path) -> Path:
    name = f"tunebench-unsaved-{rec.id}.json"
    for folder in (store.parent, Path.cwd()):
        try:
            return write_text(folder / name, rec.model_dump_json(indent=2))
        except OSError:
            continue
    return Path("(nowhere writable: the record is printed below)")
