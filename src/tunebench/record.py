"""The result record: a versioned schema (pydantic) shared by the engine, the store and reports."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
Status = Literal["ok", "oom", "failed", "timeout", "nan"]


class StepTimes(BaseModel):
    p50: float
    p90: float
    p99: float
    mean: float
    std: float


class TrainMetrics(BaseModel):
    """Every figure of a training benchmark; None where it could not be measured (never a guess)."""

    # NaN/Inf losses are results too: write them as "NaN"/"Infinity" strings, which read back as floats.
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="strings")

    world_size: int = 1
    nnodes: int = 1
    tokens_per_s: float | None = None  # global: timed tokens over all ranks / wall time of timed steps
    tokens_per_s_per_gpu: float | None = None
    samples_per_s: float | None = None
    samples_per_s_per_gpu: float | None = None
    timed_steps: int = 0
    timed_tokens: int = 0
    wall_s: float | None = None
    step_time_s: StepTimes | None = None
    peak_mem_allocated_bytes: int | None = None
    peak_mem_reserved_bytes: int | None = None
    nvml_mem_used_bytes: int | None = None
    peak_rss_bytes: int | None = None
    params_total: int | None = None
    params_trainable: int | None = None
    flops_per_token: float | None = None
    hfu_flops_per_token: float | None = None
    flops_formula: str | None = None
    peak_flops: float | None = None  # dense bf16 FLOP/s of the GPU, from the table in metrics/flops.py
    mfu: float | None = None
    hfu: float | None = None
    setup_s: float | None = None  # start of the run to its first step
    loss_first: float | None = None
    loss_last: float | None = None
    losses: list[float] = Field(default_factory=list)
    weights: str | None = None  # 'random' or 'safetensors'
    step_time_skew: float | None = None  # slowest rank's mean step time / fastest rank's - 1
    per_rank: list[dict[str, Any]] | None = None  # each rank's own figures (distributed runs)
    scaling: dict[str, Any] | None = None  # speedup and efficiency against the smallest world size run
    telemetry: dict[str, Any] | None = None  # NVML over the timed steps; absent (None) without NVML
    energy_j_per_token: float | None = None


class ResultRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    kind: str = "train"
    status: Status = "failed"
    error: str | None = None
    sweep_id: str | None = None
    tags: list[str] = Field(default_factory=list)
    config: dict[str, Any]
    config_hash: str
    environment: dict[str, Any]
    metrics: TrainMetrics = Field(default_factory=TrainMetrics)


def json_schema() -> dict[str, Any]:
    return ResultRecord.model_json_schema()


def flat_row(rec: ResultRecord) -> dict[str, Any]:
    """One flat row for CSV/Parquet: config.*, metrics.*, env.* columns (per-step loss list left out)."""
    row: dict[str, Any] = {k: getattr(rec, k) for k in ("id", "created_at", "kind", "status", "error", "sweep_id",
                                                        "config_hash")}
    row["tags"] = ",".join(rec.tags)
    row |= {f"config.{k}": ",".join(v) if isinstance(v, list) else v for k, v in rec.config.items()}
    metrics = rec.metrics.model_dump(exclude={"losses", "per_rank"})
    times = metrics.pop("step_time_s") or {}
    scaling = metrics.pop("scaling") or {}
    telemetry = metrics.pop("telemetry") or {}
    row |= {f"metrics.telemetry_{k}": ",".join(v) if isinstance(v, list) else v for k, v in telemetry.items()}
    row |= {f"metrics.{k}": v for k, v in metrics.items()}
    row |= {f"metrics.step_time_{k}_s": v for k, v in times.items()}
    row |= {f"metrics.scaling_{k}": v for k, v in scaling.items()}
    env = rec.environment
    gpu = env.get("gpu", {})
    row |= {"env.device": env.get("device"), "env.gpu": gpu.get("name"), "env.gpu_count": gpu.get("count"),
            "env.driver": env.get("driver"), "env.cuda": env.get("cuda"), "env.host": env.get("host", {}).get("hostname")}
    row |= {f"env.{k}": v for k, v in env.get("versions", {}).items()}
    row["env.git_commit"] = env.get("tunebench", {}).get("git_commit")
    return row
