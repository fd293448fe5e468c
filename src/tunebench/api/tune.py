"""`tunebench tune`: the search of tunebench.tune run for real, as a resumable sweep in the store.

Each candidate runs briefly in its own process (a time limit, an OOM or a crash is that candidate's
result), is saved at once under the tune's sweep id, and the sweep's stored definition (settings,
the candidates measured, the seconds used) is rewritten after each run, so `--resume ID` picks up
where a killed tune stopped, with what is left of its budget.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tunebench import gpus
from tunebench.api.plan import measured_hw
from tunebench.api.runs import run
from tunebench.api.sweep import new_sweep_id, sweep_lock
from tunebench.choices import resolve
from tunebench.config import RunConfig
from tunebench.errors import UserError
from tunebench.files import claim_folder, replace_manifest, write_text
from tunebench.format import duration
from tunebench.launch.isolated import Isolated
from tunebench.plan import Prediction, predict
from tunebench.record import ResultRecord
from tunebench.store import Store, check_store
from tunebench.strategies import STRATEGIES
from tunebench.tune import Candidate, Objective, Point, Space, Tuner, front
from tunebench.tune.search import key
from tunebench.tune.space import cpu_space, describe, float8_levers, memory_levers, world_of

MANIFEST = ".tunebench-tune.json"  # what a tune wrote into its folder (files.claim_folder)
CONTEXT_LIMIT = 1 << 20  # the longest sequence a context search tries where the model states no limit
PLAN_FOR_CPU = "H100-80GB"  # on a machine without a GPU, candidates are ranked by this GPU's model


@dataclass(frozen=True)
class Settings:
    base: RunConfig
    objective: str = "throughput"
    max_runs: int = 12
    max_minutes: float = 60.0
    space: Space = field(default_factory=Space)
    warmup: int = 5  # steps before the timed ones, per candidate (compilation and allocator warm-up)
    timed: int = 8  # timed steps per candidate
    run_timeout: float = 900.0  # seconds one candidate may take
    prices: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"base": self.base.model_dump(), "objective": self.objective, "max_runs": self.max_runs,
                "max_minutes": self.max_minutes, "space": self.space.as_dict(), "warmup": self.warmup,
                "timed": self.timed, "run_timeout": self.run_timeout, "prices": self.prices}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Settings:
        return cls(RunConfig.model_validate(d["base"]), d["objective"], d["max_runs"], d["max_minutes"],
                   Space.from_dict(d["space"]), d["warmup"], d["timed"], d["run_timeout"], d["prices"])


@dataclass
class TuneResult:
    id: str
    settings: Settings
    tuner: Tuner
    baseline: Candidate | None
    best: Candidate | None
    front: list[tuple[Point, Candidate]]
    runs: int
    seconds: float
    gpu: str
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        """The best's tokens/s over the baseline's."""
        b, x = self.baseline, self.best
        if not (b and x and b.record.status == "ok" and x.record.metrics.tokens_per_s):
            return None
        return x.record.metrics.tokens_per_s / b.record.metrics.tokens_per_s


def check_settings(s: Settings) -> None:
    if s.max_runs < 1:
        raise UserError(f"invalid max_runs={s.max_runs}: the budget must allow at least one run")
    if not 0 < s.max_minutes < math.inf:
        raise UserError(f"invalid max_minutes={s.max_minutes:g}: the budget must be a finite number of minutes "
                        "above zero")
    if s.warmup < 1 or s.timed < 3:
        raise UserError("invalid steps: a candidate needs at least 1 warmup step and 3 timed steps")


def objective_for(name: str, gpu: gpus.Gpu | None, prices: str | None) -> Objective:
    if name != "cost":
        return Objective(name)
    from tunebench.report.cost import load_prices, offerings_for

    offers = [o for o in offerings_for(gpu.pattern if gpu else None, load_prices(prices)) if o.on_demand]
    if gpu is None or not offers:
        where = gpu.name if gpu else "this machine (no GPU)"
        raise UserError(f"goal cost needs a price per GPU-hour for {where}: the price sheet has none "
                        "(give one with --prices FILE, or tune for throughput or memory)")
    return Objective("cost", min(o.on_demand for o in offers))


def _machine_gpu() -> tuple[gpus.Gpu | None, str]:
    """The GPU the candidates run on (None on the CPU) and what to call it."""
    found = gpus.detect()
    if found is None:
        return None, "CPU"
    return gpus.match(found[0]), found[0]


def _predictor(gpu: gpus.Gpu | None, store: str | Path) -> Callable[[RunConfig], Prediction | None]:
    target = gpu or gpus.gpu_named(PLAN_FOR_CPU)
    measured = measured_hw(store, target) if gpu else []

    def predict_one(cfg: RunConfig) -> Prediction | None:
        if gpu is None and cfg.compile == "auto":  # rank what will run: auto compiles nothing on the CPU
            cfg = cfg.model_copy(update={"compile": resolve(cfg, STRATEGIES[cfg.strategy], "cpu").compile})
        try:
            return predict(cfg, target, world_of(cfg), measured)
        except (UserError, ValueError):
            return None

    return predict_one


def short(cfg: RunConfig, s: Settings, max_step_s: float | None, timeout: float) -> RunConfig:
    """The candidate as measured: a few steps, abandoned when clearly worse, within the time left."""
    return cfg.model_copy(update={"steps": s.warmup + s.timed, "warmup": s.warmup, "max_step_s": max_step_s,
                                  "run_timeout": timeout, "tag": [*cfg.tag, "tune"]})


def _definition(tune_id: str, s: Settings, tuner: Tuner, seconds: float, gpu: str) -> dict[str, Any]:
    entries = [{"name": _name(c), "config": c.cfg.model_dump()} for c in tuner.measured]
    return {"name": f"tune {s.base.model}", "repeats": 1, "entries": entries,
            "tune": s.as_dict() | {"seconds_used": seconds, "gpu": gpu}}


def _name(c: Candidate) -> str:
    return describe(c.cfg)


def _resume(store: str | Path, tune_id: str) -> tuple[Settings, float, list[ResultRecord]]:
    if not Path(store).is_file():
        raise UserError(f"no tune with id {tune_id!r} in {store}: there is no results store there")
    with Store(store, create=False) as st:
        d = st.sweep(tune_id)
        if "tune" not in d:
            raise UserError(f"sweep {tune_id} is not a tune (it was made by tunebench sweep)")
        records = sorted(st.records(sweep_id=tune_id), key=lambda r: r.created_at)
    return Settings.from_dict(d["tune"]), float(d["tune"].get("seconds_used", 0.0)), records


def tune(settings: Settings | None, store: str | Path, out: str | Path, resume: str | None = None,
         on_event: Callable[[str], None] | None = None, budget: dict[str, Any] | None = None,
         force: bool = False) -> TuneResult:
    """Tune `settings.base` on this machine (or resume the tune `resume`, its budget replaced by `budget`'s
    max_runs / max_minutes where given), storing every run under one id. `out` is claimed first: a folder
    holding someone else's files is refused (unless `force`) before anything runs."""
    say = on_event or (lambda line: None)
    done: list[ResultRecord] = []
    used = 0.0
    if resume:
        settings, used, done = _resume(store, resume)
        settings = replace(settings, **(budget or {}))
    check_store(store)
    assert settings is not None
    check_settings(settings)
    claim_folder(Path(out), MANIFEST, "tune output", force)
    gpu, gpu_name = _machine_gpu()
    space, left_out = _space_here(settings, gpu)
    objective = objective_for(settings.objective, gpu, settings.prices)
    tuner = Tuner(settings.base, space, objective, _predictor(gpu, store), gpu.memory_bytes if gpu else None,
                  trial_steps=settings.warmup + settings.timed)
    tune_id = resume or new_sweep_id(f"tune-{settings.base.model}")
    for rec in done:
        tuner.observe(RunConfig.model_validate(rec.config), rec)
    if gpu is None:
        say(f"tune: no GPU here; candidates are ranked by the {PLAN_FOR_CPU} model, corrected by this machine's "
            "runs, and bounded by the time left" + (f"; not tried on a CPU: {', '.join(left_out)}" if left_out
                                                     else ""))
    say(f"tune {tune_id}: {len(tuner.candidates)} candidates on {gpu_name}, goal {objective.name}, "
        f"budget {settings.max_runs} runs / {settings.max_minutes:g} min" + (f" ({len(done)} runs done)" if resume
                                                                          else ""))
    baseline = key(settings.base)
    started = time.monotonic() - used
    durations: list[float] = []
    with sweep_lock(store, tune_id):
        _save_definition(store, tune_id, settings, tuner, used, gpu_name)
        while len(tuner.measured) < settings.max_runs:
            left = settings.max_minutes * 60 - (time.monotonic() - started)
            if left <= 0 or (durations and left < 0.8 * sorted(durations)[len(durations) // 2]):
                say("tune: the time budget is spent (or too little is left for another run)")
                break
            measured = {key(c.cfg) for c in tuner.measured}
            c = (Candidate(settings.base, -1, tuner.predict(settings.base)) if baseline not in measured
                 else tuner.next(left))
            if c is None:
                say("tune: every candidate left is measured, refused, predicted not to fit, clearly worse, or "
                    "expected to take longer than the time left")
                break
            t0 = time.monotonic()
            rec = _measure(c, tuner, settings, store, tune_id, left, say)
            if rec is None:
                continue
            durations.append(time.monotonic() - t0)
            tuner.observe(c.cfg, rec, durations[-1])
            used = time.monotonic() - started
            _save_definition(store, tune_id, settings, tuner, used, gpu_name)
    return _result(tune_id, settings, tuner, used, gpu_name, Path(out), baseline)


def _space_here(s: Settings, gpu: gpus.Gpu | None) -> tuple[Space, list[str]]:
    """The search space as this machine can run it, and what a CPU leaves out. For the context objective: the
    sequence doubling from the configuration's up to the model's positions, the micro-batch as given."""
    space = s.space
    if s.objective == "context" and not space.seq_lens:
        from tunebench.models.spec import resolve_model

        top = resolve_model(s.base.model).max_positions or CONTEXT_LIMIT
        lengths = [s.base.seq_len << k for k in range(32) if s.base.seq_len << k <= top] or [s.base.seq_len]
        space = replace(space, seq_lens=tuple(lengths), batches=space.batches or (s.base.batch_size,))
    if not importlib.util.find_spec("deepspeed"):
        space = replace(space, deepspeed_available=False)
    if not space.float8:  # not held by --fixed: what this machine can run
        fp8 = float8_levers(s.base, bool(gpu and gpu.fp8), importlib.util.find_spec("torchao") is not None)
        space = replace(space, float8=fp8)
    if not space.memory and gpu is not None:  # a CPU's host holds everything alike: nothing to move there
        space = replace(space, memory=memory_levers(s.base, s.objective))
    return cpu_space(space) if gpu is None else (space, [])


def _measure(c: Candidate, tuner: Tuner, s: Settings, store: str | Path, tune_id: str, left: float,
             say: Callable[[str], None]) -> ResultRecord | None:
    """The candidate's short run, stored under the tune's id, its steps shown as they go; None when this machine
    refuses it (not a run)."""
    timeout = min(left, s.run_timeout)
    max_step, why = tuner.max_step_s(c, left)
    cfg = short(c.cfg, s, max_step, timeout)
    # the planner's figure, corrected by the runs so far (on a CPU, ranked by a GPU's model: it is the correction
    # that makes it this machine's)
    guess = f", predicted {c.prediction.tokens_per_s * tuner.ratio():,.0f} tokens/s" if c.prediction else ""
    expected = tuner.expected_s(c)
    say(f"tune: run {len(tuner.measured) + 1}/{s.max_runs}: {_name(c)}{guess}"
        + (f", expected about {duration(expected)}" if expected else "") + f" ({duration(left)} left)")
    t0 = time.monotonic()
    try:
        rec = run(cfg, store, launcher=Isolated(timeout, echo=_progress_line), sweep_id=tune_id)
    except UserError as err:  # refused here (a package missing, too few GPUs): skipped, not counted
        tuner.refuse(c, str(err))
        say(f"tune:   refused: {err}")
        return None
    m = rec.metrics
    what = (f"{m.tokens_per_s:,.0f} tokens/s, {m.peak_mem_allocated_bytes / 2**30:.2f} GiB"
            if rec.status == "ok" and m.tokens_per_s and m.peak_mem_allocated_bytes else
            f"{m.tokens_per_s:,.0f} tokens/s" if rec.status == "ok" and m.tokens_per_s else
            (rec.error or "").splitlines()[0][:120])
    cut = f" (cut after its first timed steps: {why}, over {max_step:.3g} s a step)" if m.stopped_early else ""
    say(f"tune:   {rec.status} in {duration(time.monotonic() - t0)}: {what}{cut}")
    return rec


def _progress_line(line: str) -> bool:
    """A child's output shown during a tune: its step lines and its expected time (console.progress writes them
    as `NAME: step K/N ...` and `NAME: N steps: about ...`), not its warnings."""
    return ": step " in line or " steps: about " in line


def _save_definition(store: str | Path, tune_id: str, s: Settings, tuner: Tuner, seconds: float, gpu: str) -> None:
    with Store(store) as st:
        st.save_sweep(tune_id, f"tune {s.base.model}", datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      _definition(tune_id, s, tuner, seconds, gpu))


def _points(tuner: Tuner) -> list[tuple[Point, Candidate]]:
    out = []
    for c in tuner.measured:
        m = c.record.metrics
        memory = m.peak_mem_allocated_bytes or m.peak_rss_bytes  # on the CPU: the process's peak RSS
        if c.record.status != "ok" or not m.tokens_per_s or not memory:
            continue
        cost = Objective("cost", tuner.objective.price_per_gpu_hour).of(m.tokens_per_s, None, c.world) \
            if tuner.objective.price_per_gpu_hour else None
        out.append((Point(c.record.id, m.tokens_per_s, memory, -cost if cost else None), c))
    return out


def _result(tune_id: str, s: Settings, tuner: Tuner, seconds: float, gpu: str, out: Path,
            baseline_hash: str) -> TuneResult:
    pts = _points(tuner)
    on_front = {p.key for p in front([p for p, _ in pts])}
    baseline = next((c for c in tuner.measured if key(c.cfg) == baseline_hash), None)
    result = TuneResult(tune_id, s, tuner, baseline, tuner.best(), [(p, c) for p, c in pts if p.key in on_front],
                        len(tuner.measured), seconds, gpu)
    if result.best is not None:
        result.files = write_outputs(result, out)
    return result


def best_config(result: TuneResult) -> RunConfig:
    """The best candidate as a config to run or train with: the base's own steps, no tuning-only keys."""
    base = result.settings.base
    return result.best.cfg.model_copy(update={"steps": base.steps, "warmup": base.warmup, "max_step_s": None,
                                              "run_timeout": base.run_timeout, "tag": base.tag})


def write_outputs(result: TuneResult, out: Path) -> dict[str, Path]:
    """best.yaml (accepted by run and train), the Pareto plot, and the tune's summary as JSON."""
    import json

    import yaml

    from tunebench.report.plots import pareto

    out.mkdir(parents=True, exist_ok=True)  # claimed by tune() before it ran
    best = best_config(result)
    defaults = RunConfig().model_dump()
    fields = {k: v for k, v in best.model_dump().items() if v != defaults[k] or k == "model"}
    files = {"best": write_text(out / "best.yaml", "# tunebench tune " + result.id + ": the best configuration "
                                f"({result.settings.objective})\n" + yaml.safe_dump(fields, sort_keys=False))}
    points = [(p, _name(c)) for p, c in _points(result.tuner)]
    on_gpu = any(c.record.metrics.peak_mem_allocated_bytes for _, c in _points(result.tuner))
    plot = pareto(points, {p.key for p, _ in result.front}, out, f"tune {result.id}",
                  "peak memory per GPU (GiB, allocated)" if on_gpu else
                  "peak host memory (GiB, the process's RSS: a CPU run allocates no GPU memory)")
    if plot:
        files["pareto"] = plot
    files["summary"] = write_text(out / "tune.json", json.dumps(summary(result), indent=2))
    replace_manifest(out, MANIFEST, list(files.values()))
    return files


def summary(result: TuneResult) -> dict[str, Any]:
    """The tune as JSON: the budget used, the best and its speedup, the front, every run."""
    def run_of(c: Candidate) -> dict[str, Any]:
        m = c.record.metrics
        return {"name": _name(c), "record": c.record.id, "status": c.record.status, "tokens_per_s": m.tokens_per_s,
                "peak_mem_allocated_bytes": m.peak_mem_allocated_bytes, "peak_rss_bytes": m.peak_rss_bytes,
                "stopped_early": bool(m.stopped_early), "seconds": c.seconds,
                "predicted_tokens_per_s": c.prediction.tokens_per_s if c.prediction else None,
                "config": c.cfg.model_dump()}

    best = result.best
    return {"id": result.id, "objective": result.settings.objective, "runs": result.runs,
            "minutes": result.seconds / 60, "gpu": result.gpu, "speedup_over_baseline": result.speedup,
            "baseline": run_of(result.baseline) if result.baseline and result.baseline.record else None,
            "best": run_of(best) if best else None,
            "front": [run_of(c) | {"usd_per_1m_tokens": p.cost} for p, c in result.front],
            "measured": [run_of(c) for c in result.tuner.measured],
            "files": {k: str(v) for k, v in result.files.items()}}
