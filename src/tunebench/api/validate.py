"""`tunebench plan --validate SOURCE`: the planner against GPU runs that were measured, as a new user would plan them.

    validate(source) -> Validation          every run checked with the source's `hw` records and without
    tables(validation) -> [Table]           the summary by set and the runs one by one

SOURCE: a results store, a `results export` file (JSONL or a JSON list), a training job's record.json, or a folder
holding any of these (searched recursively). Every GPU run among them (kind `train`: `run` benchmarks and `train`
jobs) is planned with its configuration as it ran (`auto` choices as they were made), on the GPU and process count it
ran on, with the source's `tunebench hw` records of that GPU, and again from the spec sheet alone (as on a
machine never measured). An ok run is held to its memory, its speed and its verdict (a run that ran is never "does not
fit"); a run that failed out of memory to its verdict only (never "fits").

Each run is in one of two sets. `fitted`: the planner's constants were fitted on it (its id is listed in
plan/fitted_records.txt); `held out`: never used to fit anything, so its errors are what a new run can expect.
A user's own runs are all held out. A constant refitted is fitted on one set and checked on the other.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tunebench import gpus
from tunebench.api.plan import hw_figures, run_config, what_ran
from tunebench.document import Table
from tunebench.errors import UserError
from tunebench.format import fmt, gib
from tunebench.plan import predict
from tunebench.record import ResultRecord
from tunebench.store import Store, read_exported

FITTED_LIST = Path(__file__).resolve().parent.parent / "plan" / "fitted_records.txt"
MEMORY_GOAL, SPEED_GOAL = 0.03, 0.10
SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass
class Check:
    """One measured run against its prediction."""

    record: ResultRecord
    set: str  # fitted | held out
    gpu: str
    predicted_mem: float | None = None
    predicted_tps: float | None = None
    verdict: str | None = None
    mem_error: float | None = None  # predicted / measured - 1
    tps_error: float | None = None
    verdict_wrong: bool = False
    note: str = ""  # why a figure is not held to the goal, or why nothing was predicted

    @property
    def label(self) -> str:
        from tunebench.format import config_label

        return config_label(self.record.config, world_size=self.record.metrics.world_size)


@dataclass
class Summary:
    set: str
    runs: int = 0
    memory: list[float] = field(default_factory=list)  # |error| of the runs held to memory
    speed: list[float] = field(default_factory=list)
    verdicts: int = 0
    verdicts_wrong: int = 0


@dataclass
class Validation:
    source: str
    checks: list[Check]  # with the source's hw records where it has them
    spec_sheet: list[Check] | None  # the same runs from the spec sheet alone; None where the source has no hw record
    skipped: list[str]

    def summaries(self, checks: list[Check]) -> list[Summary]:
        out = {s: Summary(s) for s in ("held out", "fitted")}
        for c in checks:
            s = out[c.set]
            s.runs += 1
            if c.mem_error is not None and not c.note:
                s.memory.append(abs(c.mem_error))
            if c.tps_error is not None:
                s.speed.append(abs(c.tps_error))
            if c.verdict is not None:
                s.verdicts += 1
                s.verdicts_wrong += c.verdict_wrong
        return [s for s in out.values() if s.runs]


def fitted_ids() -> set[str]:
    """The 12-character ids of the records the planner's constants were fitted on."""
    lines = FITTED_LIST.read_text().splitlines() if FITTED_LIST.is_file() else []
    return {ln.split()[0] for ln in lines if ln.strip() and not ln.startswith("#")}


def _records(source: Path, skipped: list[str]) -> list[ResultRecord]:
    if source.is_dir():
        found = []
        for p in sorted(source.rglob("*")):
            if p.is_file() and (p.suffix in (".jsonl", ".db") or p.name == "record.json"):
                found += _records(p, skipped)
        return found
    if not source.is_file():
        raise UserError(f"invalid validate={source}: no such file or folder (give a results store, a results "
                        "export, a record.json or a folder of them)")
    with open(source, "rb") as f:
        head = f.read(16)
    if head == SQLITE_MAGIC:
        with Store(source, create=False) as store:
            records = list(store.records())
            skipped += store.skipped
        return records
    return read_exported(source, skipped)


def _check(rec: ResultRecord, hw: dict[gpus.Gpu, list[tuple[str, dict]]], fitted: set[str]) -> Check | None:
    gpu = gpus.match(rec.environment.get("gpu", {}).get("name"))
    if rec.kind != "train" or rec.environment.get("device") != "cuda" or rec.status not in ("ok", "oom"):
        return None
    c = Check(rec, "fitted" if rec.id[:12] in fitted else "held out", gpu.name if gpu else "?")
    if gpu is None:
        c.note = f"GPU {rec.environment.get('gpu', {}).get('name')!r} not in the catalog"
        return c
    m = rec.metrics
    try:
        p = predict(run_config(what_ran(rec)), gpu, m.world_size or 1, hw.get(gpu, []),
                    bool(m.job and m.job.eval_data))
    except (UserError, ValueError) as err:
        c.note = f"not planned: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
        return c
    c.predicted_mem, c.predicted_tps, c.verdict = p.mem.peak_allocated, p.tokens_per_s, p.verdict
    if rec.status == "oom":
        c.verdict_wrong = p.verdict == "fits"
        c.note = "out of memory: verdict only"
        return c
    c.verdict_wrong = p.verdict == "does not fit"
    if m.peak_mem_allocated_bytes:
        c.mem_error = p.mem.peak_allocated / m.peak_mem_allocated_bytes - 1
    if m.tokens_per_s:
        c.tps_error = p.tokens_per_s / m.tokens_per_s - 1
    if rec.config.get("float8", "off") != "off" and rec.config.get("method") != "full":
        c.note = "a frozen float8 base: memory predicted as bf16's"
    elif rec.config.get("strategy") == "zero3" and rec.config.get("method") == "qlora":
        c.note = "QLoRA under ZeRO-3: the 4-bit base's gathering is not modelled"
    return c


def validate(source: str | Path) -> Validation:
    """Every GPU run in `source` against the planner, with the source's `hw` records and without."""
    skipped: list[str] = []
    unique: dict[str, ResultRecord] = {}
    for r in _records(Path(source).expanduser(), skipped):
        unique.setdefault(r.id, r)  # a folder may hold a store and its export
    records = list(unique.values())
    measured = [r for r in records if r.kind == "hw" and r.status == "ok"]
    kinds = {g for r in measured if (g := gpus.match(r.environment.get("gpu", {}).get("name"))) is not None}
    hw = {g: hw_figures(measured, g) for g in kinds}
    fitted = fitted_ids()

    def checked(measured: dict) -> list[Check]:
        return [c for rec in records if (c := _check(rec, measured, fitted)) is not None]

    checks = checked(hw)
    if not checks:
        raise UserError(f"invalid validate={source}: no GPU run in it (records of kind `train` from `tunebench run` "
                        "or `train` on a GPU)")
    return Validation(str(source), checks, checked({}) if hw else None, skipped)


def _share(errors: list[float], goal: float) -> str:
    return f"{sum(e <= goal for e in errors)} of {len(errors)}" if errors else "-"


def _pct(errors: list[float], pick) -> str:  # noqa: ANN001 - statistics.median or max
    return f"{pick(errors):.1%}" if errors else "-"


def tables(v: Validation) -> list[Table]:
    """The summary (each set, with hw records and from the spec sheet) and every run with its errors."""
    summary = Table(["set", "hardware figures", "runs", f"memory within {MEMORY_GOAL:.0%}", "within 5%", "median",
                     "worst", f"tokens/s within {SPEED_GOAL:.0%}", "median", "worst", "verdicts wrong"],
                    title=f"tunebench plan --validate: the planner against {len(v.checks)} GPU runs in {v.source}")
    sources = [("the source's hw records" if v.spec_sheet is not None else "the spec sheet", v.checks)]
    if v.spec_sheet is not None:
        sources.append(("the spec sheet", v.spec_sheet))
    for name, checks in sources:
        for s in v.summaries(checks):
            summary.add(s.set, name, str(s.runs), _share(s.memory, MEMORY_GOAL), _share(s.memory, 0.05),
                        _pct(s.memory, statistics.median), _pct(s.memory, max), _share(s.speed, SPEED_GOAL),
                        _pct(s.speed, statistics.median), _pct(s.speed, max), f"{s.verdicts_wrong} of {s.verdicts}")
    runs = Table(["set", "gpu", "configuration", "peak memory", "predicted", "error", "tokens/s", "predicted",
                  "error", "verdict", "note"], title="each run (predicted with the figures of the first row above)")
    for c in sorted(v.checks, key=lambda c: (c.set != "held out", c.gpu, c.label)):
        m = c.record.metrics
        runs.add(c.set, c.gpu, c.label, gib(m.peak_mem_allocated_bytes), gib(c.predicted_mem),
                 "-" if c.mem_error is None else f"{c.mem_error:+.1%}", fmt(m.tokens_per_s, ",.0f"),
                 fmt(c.predicted_tps, ",.0f"), "-" if c.tps_error is None else f"{c.tps_error:+.1%}",
                 (c.verdict or "-") + (" (wrong)" if c.verdict_wrong else ""), c.note)
    return [summary, runs]
