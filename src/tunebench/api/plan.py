"""Predictions for configurations: on which GPU, how many of them, with the store's hardware measurements.

    plan(cfg, gpu=None, world=None, store=None)       one Prediction (the GPU named, or this machine's)
    evaluates(train_config)                           whether a train job evaluates (a memory phase of its own)
    compare(cfg, gpu, worlds, strategies, store)      one row per strategy x world size (refusals named)
    prediction_for(rec)                               what the planner says of a finished run's config
    job(train_cfg, prediction)                        a train config's data counted: its steps, time and cost
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tunebench import gpus
from tunebench.config import RunConfig
from tunebench.errors import UserError
from tunebench.gpus import Gpu
from tunebench.plan import Prediction, predict
from tunebench.record import ResultRecord
from tunebench.store import Store
from tunebench.strategies import STRATEGIES

DEFAULT_WORLDS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Row:
    strategy: str
    world: int
    prediction: Prediction | None
    refused: str | None = None


def target_gpu(name: str | None) -> tuple[Gpu, int]:
    """The GPU named (with no count known: 0), or this machine's and how many it has."""
    if name:
        return gpus.gpu_named(name), 0
    found = gpus.detect()
    if found is None:
        raise UserError(f"no GPU detected on this machine: name the GPU to plan for with --gpu ({gpus.known()})")
    gpu = gpus.match(found[0])
    if gpu is None:
        raise UserError(f"this machine's GPU ({found[0]}) is not in the catalog: plan for a known one with --gpu "
                        f"({gpus.known()})")
    return gpu, found[1]


def measured_hw(store: str | Path | None, gpu: Gpu) -> list[tuple[str, dict]]:
    """(id, metrics) of the store's `hw` records for this kind of GPU, newest first."""
    if not store or not Path(store).exists():
        return []
    with Store(store, create=False) as s:
        return hw_figures(s.records(kind="hw"), gpu)


def hw_figures(records: Iterable[ResultRecord], gpu: Gpu) -> list[tuple[str, dict]]:
    """(id, metrics) of the `hw` records among `records` for this kind of GPU, newest first."""
    recs = [r for r in records if r.kind == "hw" and gpus.match(r.environment.get("gpu", {}).get("name")) == gpu]
    recs.sort(key=lambda r: r.created_at, reverse=True)
    return [(r.id[:12], r.metrics.model_dump()) for r in recs]


def default_world(cfg: RunConfig, detected: int) -> int:
    """The config's own process count, else every detected GPU for a distributed strategy, else one."""
    if cfg.nproc_per_node:
        return cfg.nproc_per_node * cfg.nnodes
    if STRATEGIES[cfg.strategy].one_process:
        return 1
    return max(detected, 1) * cfg.nnodes


def plan(cfg: RunConfig, gpu: str | None = None, world: int | None = None,
         store: str | Path | None = None, evaluates: bool = False) -> Prediction:
    """`evaluates`: the run is a train job that evaluates between its steps (evaluates(train_cfg) says)."""
    target, detected = target_gpu(gpu)
    return predict(cfg, target, world or default_world(cfg, detected), measured_hw(store, target), evaluates)


def evaluates(train_config: dict) -> bool:
    """A train job's config holds out rows to evaluate on (eval_data, or a fraction of its data)."""
    return bool(train_config.get("eval_data") or train_config.get("eval_fraction"))


def compare(cfg: RunConfig, gpu: str | None = None, worlds: list[int] | None = None,
            strategies: list[str] | None = None, store: str | Path | None = None,
            evaluates: bool = False) -> list[Row]:
    """The configuration under each strategy and world size; a strategy that refuses it says why."""
    unknown = [n for n in strategies or [] if n not in STRATEGIES]
    if unknown:
        raise UserError(f"invalid strategies={','.join(unknown)}: choose from {', '.join(STRATEGIES)}")
    target, _ = target_gpu(gpu)
    measured = measured_hw(store, target)
    rows = []
    for name in strategies or list(STRATEGIES):
        for world in worlds or DEFAULT_WORLDS:
            if STRATEGIES[name].one_process and world > 1:
                continue
            try:
                variant = cfg.model_copy(update={"strategy": name, "nproc_per_node": world // cfg.nnodes or 1})
                rows.append(Row(name, world, predict(variant, target, world, measured, evaluates)))
            except UserError as err:
                rows.append(Row(name, world, None, str(err)))
    return rows


STORED = ("gpu", "world_size", "hardware", "peak_mem_allocated_bytes", "tokens_per_s", "tokens_per_s_per_gpu",
          "step_time_s", "mfu", "memory_needed_bytes", "verdict")


def run_config(config: dict) -> RunConfig:
    """The RunConfig within a stored run's or training job's config."""
    fields = {k: v for k, v in config.items() if k in RunConfig.model_fields and v is not None}
    fields["steps"] = max(fields.get("steps") or 0, fields.get("warmup", 0) + 1)
    return RunConfig(**fields)


def what_ran(r: ResultRecord) -> dict:
    """A stored run's config with its 'auto' choices as they were made (precision, compile, CUDA graphs)."""
    ran = r.config | {"precision": r.metrics.precision or r.config.get("precision")}
    if r.config.get("compile") == "auto":
        ran["compile"] = bool(r.metrics.compile_scope)
    if r.metrics.compile_scope and r.config.get("compile_scope", "auto") == "auto":
        ran["compile_scope"] = r.metrics.compile_scope  # what auto chose then (it has changed since)
    if r.config.get("cuda_graphs", "auto") == "auto":
        ran["cuda_graphs"] = bool(r.metrics.cuda_graphs)  # none before the field: eager launches
    return ran


def prediction_for(rec: ResultRecord, store: str | Path | None = None) -> dict | None:
    """What the planner says of a finished GPU training run (None on the CPU, or for a model it cannot plan):
    the record's metric names with the phase of the peak and what bounds the step."""
    gpu = gpus.match(rec.environment.get("gpu", {}).get("name"))
    if rec.kind != "train" or rec.environment.get("device") != "cuda" or gpu is None:
        return None
    try:
        p = predict(run_config(what_ran(rec)), gpu, rec.metrics.world_size, measured_hw(store, gpu),
                    bool(rec.metrics.job and rec.metrics.job.eval_data)).as_dict()
    except (UserError, ValueError):
        return None
    except Exception as err:  # the run happened: a planner's fault costs its prediction, never the record
        why = str(err).splitlines()[0] if str(err) else ""
        print(f"tunebench: warning: no prediction for result {rec.id[:12]} (the planner failed: "
              f"{type(err).__name__}: {why})", file=sys.stderr)
        return None
    return {k: p[k] for k in STORED} | {"peak_phase": p["breakdown"]["peak_phase"], "bound": p["breakdown"]["bound"]}


def with_predictions(records: list[ResultRecord], store: str | Path | None = None) -> list[ResultRecord]:
    """GPU runs stored without a prediction (older records, imported ones) get today's, in memory only."""
    for rec in records:
        if rec.kind == "train" and rec.metrics.predicted is None:
            rec.metrics.predicted = prediction_for(rec, store)
    return records


@dataclass(frozen=True)
class JobPlan:
    """A training job's data, tokenized as `train` will (and cached for it), and what the whole job takes."""

    stats: dict  # the prepared rows' statistics (examples, rows, tokens, trained tokens, truncated, ...)
    eval_rows: int
    steps: int
    seconds: float  # the steps at the predicted step time (evaluations and saving not counted)
    cost: str  # ", $X on demand at PROVIDER" or "" where the price sheet has no price for the GPU


def job(cfg, prediction: Prediction) -> JobPlan:
    """`cfg` (a TrainConfig): its data read, tokenized with its tokenizer and cached; its steps at the
    prediction's step time and the price sheet's cheapest on-demand price."""
    from tunebench.data.prepare import split_and_prepare
    from tunebench.data.tokenizer import load_tokenizer
    from tunebench.models.spec import resolve_model
    from tunebench.report.cost import on_demand_cost

    tok = load_tokenizer(cfg, resolve_model(cfg.model))
    rows, held = split_and_prepare(cfg, tok)
    steps = cfg.total_steps(rows.rows, prediction.world)
    seconds = steps * prediction.time.seconds
    return JobPlan(rows.stats, held.stats["rows"] if held else 0, steps, seconds,
                   on_demand_cost(seconds, prediction.world, prediction.hw.gpu.name))
