"""Compare two sets of results configuration by configuration: throughput, memory and MFU ratios.

A configuration is the same when its config hash is (tags and launch details excluded). A change
beyond the threshold is flagged; a throughput drop, a memory rise or an MFU drop beyond it is a
regression, which makes `tunebench compare` exit 1 so it can guard CI.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from tunebench.errors import UserError
from tunebench.format import label
from tunebench.record import ResultRecord
from tunebench.store import Store, read_exported


def load_side(ref: str, store: str | None, skipped: list[str] | None = None) -> list[ResultRecord]:
    """A store file (.db), an exported JSON-lines file (.jsonl), or a sweep id in --store.

    Records that cannot be read are left out and described in `skipped`."""
    skipped = [] if skipped is None else skipped
    p = Path(ref)
    if p.suffix == ".db":
        if not p.is_file():
            raise UserError(f"store {ref} does not exist")
        with Store(p, create=False) as s:
            recs = list(s.records())
        skipped += s.skipped
        return recs
    if p.suffix in (".jsonl", ".json"):
        return read_exported(p, skipped)
    with Store(store, create=False) as s:
        recs = list(s.records(sweep_id=ref))
    skipped += s.skipped
    if not recs:
        raise UserError(f"{ref} is neither a .db/.jsonl file nor a sweep in {s.path}")
    return recs


@dataclass
class Row:
    name: str
    ratios: dict[str, float | None]  # B / A for tokens_per_s, peak memory, mfu
    flags: list[str]
    regression: bool


METRICS = (("tokens/s", "tokens_per_s", +1), ("peak memory", "peak_mem_allocated_bytes", -1), ("MFU", "mfu", +1))


COMPARABLE = ("train", "infer")  # kinds with tokens/s; hw and load records have no workload to match


def _mean(recs: list[ResultRecord], attr: str) -> float | None:
    vals = [getattr(r.metrics, attr, None) for r in recs if r.status == "ok"]
    vals = [v for v in vals if v is not None]
    return statistics.fmean(vals) if vals else None


def compare(a: list[ResultRecord], b: list[ResultRecord], threshold: float = 0.05) -> tuple[list[Row], list[str]]:
    by_a: dict[str, list[ResultRecord]] = {}
    by_b: dict[str, list[ResultRecord]] = {}
    for r in a:
        if r.kind in COMPARABLE:
            by_a.setdefault(r.config_hash, []).append(r)
    for r in b:
        if r.kind in COMPARABLE:
            by_b.setdefault(r.config_hash, []).append(r)
    rows = []
    for h in [h for h in by_a if h in by_b]:
        ra, rb = by_a[h], by_b[h]
        name = label(ra[0])
        ratios, flags, regression = {}, [], False
        ok_a, ok_b = any(r.status == "ok" for r in ra), any(r.status == "ok" for r in rb)
        if ok_a and not ok_b:
            flags.append(f"now {', '.join(sorted({r.status for r in rb}))}")
            regression = True
        for what, attr, better in METRICS:
            va, vb = _mean(ra, attr), _mean(rb, attr)
            ratios[what] = vb / va if va and vb is not None else None
            if ratios[what] is not None and abs(ratios[what] - 1) > threshold:
                change = ratios[what] - 1
                worse = change * better < 0
                flags.append(f"{what} {change:+.1%}" + (" (regression)" if worse else ""))
                regression |= worse
        rows.append(Row(name, ratios, flags, regression))
    only = [f"only in A: {len(set(by_a) - set(by_b))} configurations", f"only in B: {len(set(by_b) - set(by_a))}"]
    return rows, only
