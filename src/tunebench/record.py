"""The result record: a versioned schema (pydantic) shared by the engine, the store and reports."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

# 2: kinds hw, load, infer (and later eval), each with its own metrics (version 1 records, all kind train, read as
# before)
SCHEMA_VERSION = 2
Status = Literal["ok", "oom", "failed", "timeout", "nan"]
Kind = Literal["train", "hw", "load", "infer", "eval"]


class StepTimes(BaseModel):
    p50: float
    p90: float
    p99: float
    mean: float
    std: float


class Figures(BaseModel):
    """A typed group of figures. Unknown keys are kept (records from other versions stay readable), and
    it also reads like the dict it is stored as (``t["energy_j"]``)."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="strings")

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)


class GpuTelemetry(Figures):
    """NVML over one GPU's timed region (metrics.telemetry.Telemetry)."""

    samples: int
    interval_s: float
    wall_s: float
    gpu_util_mean_pct: float
    gpu_util_min_pct: int
    power_mean_w: float
    power_max_w: float
    energy_j: float
    energy_source: str  # "counter" (the GPU's energy counter) or "power x time"
    temperature_max_c: int
    sm_clock_mean_mhz: float
    sm_clock_min_mhz: int
    throttle_reasons: list[str] = Field(default_factory=list)


class RunTelemetry(Figures):
    """Every GPU of a run together: energy and power summed, the worst clock and temperature kept."""

    gpus: int
    energy_j: float
    power_mean_w: float
    gpu_util_mean_pct: float
    temperature_max_c: int
    sm_clock_min_mhz: int
    sm_clock_mean_mhz: float
    throttle_reasons: list[str] = Field(default_factory=list)
    energy_source: str
    samples: int


class RankFigures(Figures):
    """What one rank measured. Its step times travel between processes but are not stored per rank."""

    rank: int = 0
    host: str | None = None
    timed_steps: int = 0
    tokens: int = 0
    samples: int = 0
    wall_s: float = 0.0
    step_times: list[float] = Field(default_factory=list, exclude=True)
    tokens_per_s: float | None = None
    telemetry: GpuTelemetry | None = None
    peak_mem_allocated_bytes: int | None = None
    peak_mem_reserved_bytes: int | None = None
    nvml_mem_used_bytes: int | None = None
    peak_rss_bytes: int | None = None
    step_time_mean_s: float | None = None


class Scaling(Figures):
    """Speedup and efficiency = tokens/s(N) / (N x tokens/s(baseline)) against a scaling series' first ok run."""

    baseline_id: str
    baseline_world_size: int
    speedup: float
    efficiency: float


class JobFigures(Figures):
    """A training job (`tunebench train`) beside its throughput figures: the data, the losses, the outputs,
    and the time it took against the time its benchmark predicted."""

    data: dict[str, Any] = Field(default_factory=dict)  # source, fingerprint, shape, examples, truncated, ...
    eval_data: dict[str, Any] | None = None
    steps: int = 0  # optimizer steps done (resumed ones included)
    planned_steps: int = 0
    epochs: float = 0.0  # passes over the training rows
    tokens: int = 0  # tokens processed in those steps (padding included, as the benchmark counts)
    train_loss: float | None = None  # the last step's
    eval_loss: float | None = None  # the last evaluation's
    eval_perplexity: float | None = None
    eval_curve: list[list[float]] = Field(default_factory=list)  # [step, eval loss]
    target_eval_loss: float | None = None
    time_to_target_s: float | None = None  # training seconds until eval loss first reached the target
    # a preference objective's last evaluation: loss, rewards_chosen, rewards_rejected, reward_margin,
    # reward_accuracy, pairs; and every evaluation's as [step, those figures]
    preference: dict[str, float] | None = None
    preference_curve: list[list[Any]] = Field(default_factory=list)
    train_s: float | None = None  # training seconds of the whole job (every resumed part included)
    predicted_s: float | None = None  # the planned steps' time, from the prediction
    predicted_tokens_per_s: float | None = None
    predicted_from: str | None = None  # "stored run <id>" or "the first timed steps"
    exit: str = "completed"  # completed | preempted (a signal: checkpoint saved) | stopped (nan or failure)
    resumed_from: str | None = None
    checkpoints: list[str] = Field(default_factory=list)
    outputs: dict[str, str] = Field(default_factory=dict)  # adapter / model / merged -> folder
    trackers: dict[str, str] = Field(default_factory=dict)  # tracker -> where its run is (a URL or a folder)
    # eval_tasks' scores (role, model, task, metric, value, stderr, samples, record: the eval record's id)
    evaluations: list[dict[str, Any]] = Field(default_factory=list)


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
    mfu_noncausal: float | None = None  # the references' convention: attention counted as the full S x S product
    setup_s: float | None = None  # start of the run to its first step, plus compile_s
    compile_s: float | None = None  # torch.compile's time (in the untimed first steps); None when eager
    compile_scope: str | None = None  # what compile ran as: "blocks" or "model"; None when eager
    cuda_graphs: bool | None = None  # True: the whole model's graph was replayed as CUDA graphs
    loss_first: float | None = None
    loss_last: float | None = None
    losses: list[float] = Field(default_factory=list)
    weights: str | None = None  # 'random' or 'safetensors'
    precision: str | None = None  # what ran: the config's precision, with 'auto' made concrete for the device
    step_time_skew: float | None = None  # slowest rank's mean step time / fastest rank's - 1
    per_rank: list[RankFigures] | None = None  # each rank's own figures (distributed runs)
    scaling: Scaling | None = None  # speedup and efficiency against the scaling series' first ok run
    telemetry: RunTelemetry | None = None  # NVML over the timed steps; absent (None) without NVML
    energy_j_per_token: float | None = None
    job: JobFigures | None = None  # a training job's own figures (tunebench train); None for a benchmark
    stopped_early: bool | None = None  # abandoned after 3 timed steps slower than the config's max_step_s
    # tunebench plan's figures for this config on this GPU, stored with the run (GPU runs of known models)
    predicted: dict[str, Any] | None = None


class HwMetrics(BaseModel):
    """`tunebench hw`: what the device itself can do. GB/s and TFLOP/s are decimal (1e9, 1e12)."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="strings")

    device_name: str | None = None
    mamf_tflops: float | None = None  # best per-shape mean TFLOP/s of mamf_dtype over the shapes swept
    mamf_dtype: str | None = None
    mamf_shape: list[int] | None = None  # m, n, k
    mamf_fraction_of_peak: float | None = None  # of the dense bf16 peak in metrics/flops.py, where known
    matmul: list[dict[str, Any]] = Field(default_factory=list)  # per dtype: best figures and every shape
    host_dispatch_us: float | None = None  # one thread launching a tiny model's forward + backward (hw.host)
    host_dispatch: dict[str, Any] | None = None  # its shape, iterations, best
    copy_gbps: float | None = None  # device memory copy, (read + write bytes) / time, median
    device_copy: dict[str, Any] | None = None  # its bytes, iterations, best and mean
    transfers: list[dict[str, Any]] = Field(default_factory=list)  # host<->device, pinned and pageable
    collectives: list[dict[str, Any]] = Field(default_factory=list)  # op, bytes, time, algbw, busbw (nccl-tests)
    collective_world_size: int | None = None
    collective_backend: str | None = None
    busbw_peak_gbps: dict[str, float] | None = None  # per op: the highest busbw over the sizes
    sections: dict[str, str] = Field(default_factory=dict)  # section -> "ok", "skipped: why" or the error
    collectives_telemetry: RunTelemetry | None = None
    telemetry: GpuTelemetry | None = None
    wall_s: float | None = None


class LoadMetrics(BaseModel):
    """`tunebench load`: time and memory to load a model at one precision."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="strings")

    precision: str | None = None
    load_s: float | None = None  # from_pretrained, from call to weights on the device (synchronised)
    disk_bytes: int | None = None  # safetensors files read
    read_gbps: float | None = None  # disk_bytes / load_s
    cache: str | None = None  # 'warm' (files read once before) or 'cold' (evicted from the page cache)
    model_bytes: int | None = None  # parameters + buffers as loaded (what the weights occupy)
    mem_allocated_bytes: int | None = None  # allocated on the GPU once loaded
    mem_fraction: float | None = None  # mem_allocated_bytes / the GPU's memory
    peak_mem_allocated_bytes: int | None = None  # during the load (quantization needs transient room)
    peak_mem_reserved_bytes: int | None = None
    nvml_mem_used_bytes: int | None = None
    rss_delta_bytes: int | None = None  # host memory the process grew by (on the CPU: after every weight was read)
    peak_rss_bytes: int | None = None
    params_total: int | None = None
    weights: str | None = None  # 'safetensors' (local directory) or 'random' (preset written to a temp dir)
    telemetry: GpuTelemetry | None = None


class InferMetrics(BaseModel):
    """`tunebench infer`: greedy generation at one batch size and precision (medians over the repeats)."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="strings")

    batch_size: int = 1
    prompt_len: int = 0
    new_tokens: int = 0
    repeats: int = 0
    tokens_per_s: float | None = None  # generated tokens (batch x new) / (prefill + decode time)
    ttft_s: float | None = None  # time to first token: prefill and the first token's choice
    prefill_tokens_per_s: float | None = None  # prompt tokens (batch x prompt) / ttft
    decode_s: float | None = None  # after the first token, to the last
    decode_tokens_per_s: float | None = None  # batch x (new - 1) / decode_s
    ms_per_token: float | None = None  # one decode step (every sequence of the batch advances one token)
    ttft_all_s: list[float] = Field(default_factory=list)
    decode_all_s: list[float] = Field(default_factory=list)
    warmup_s: float | None = None  # the untimed first generation (includes torch.compile when on)
    model_bytes: int | None = None
    weight_read_gbps: float | None = None  # model_bytes read per decode step / step time: a floor on traffic
    peak_mem_allocated_bytes: int | None = None
    peak_mem_reserved_bytes: int | None = None
    nvml_mem_used_bytes: int | None = None
    peak_rss_bytes: int | None = None
    params_total: int | None = None
    weights: str | None = None
    telemetry: GpuTelemetry | None = None
    energy_j_per_token: float | None = None  # per generated token


class EvalMetrics(BaseModel):
    """`tunebench eval`: one model's scores on one lm-evaluation-harness task."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="strings")

    task: str = ""
    metric: str | None = None  # the task's first metric: the one tables show
    value: float | None = None
    stderr: float | None = None
    higher_is_better: bool | None = None
    scores: dict[str, dict[str, float | None]] = Field(default_factory=dict)  # metric -> {value, stderr}
    samples: int | None = None  # examples scored (after limit)
    samples_total: int | None = None  # examples the task has
    num_fewshot: int | None = None
    model: str = ""  # the folder scored
    role: Literal["fine-tuned", "base", "model"] = "model"  # of a training job's output, or a model on its own
    train_record: str | None = None  # the id of the training job's record the model came from
    output_dir: str | None = None
    eval_s: float | None = None  # the harness's time for this model's tasks, loading excluded


METRICS = {"train": TrainMetrics, "hw": HwMetrics, "load": LoadMetrics, "infer": InferMetrics, "eval": EvalMetrics}
AnyMetrics = TrainMetrics | HwMetrics | LoadMetrics | InferMetrics | EvalMetrics


class ResultRecord(BaseModel):
    # NaN/Inf (a diverged loss) as "NaN"/"Infinity" strings here too: through the metrics union the
    # inner models' own setting is not applied.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    schema_version: Literal[1, 2] = SCHEMA_VERSION
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    kind: Kind = "train"
    status: Status = "failed"
    error: str | None = None
    sweep_id: str | None = None
    tags: list[str] = Field(default_factory=list)
    config: dict[str, Any]
    config_hash: str
    environment: dict[str, Any]
    metrics: AnyMetrics = Field(default_factory=TrainMetrics)
    _saved_to: str | None = PrivateAttr(None)  # the store it was saved to in this process (never serialized)

    @property
    def saved_to(self) -> str | None:
        return self._saved_to

    @classmethod
    def for_config(cls, cfg: Any, environment: dict[str, Any], **fields: Any) -> ResultRecord:
        """A record of a validated config (RunConfig, HwConfig): its dump, hash and tags filled in."""
        return cls(config=cfg.model_dump(), config_hash=cfg.config_hash(), environment=environment, tags=cfg.tag,
                   **fields)

    @field_validator("metrics", mode="before")
    @classmethod
    def _metrics_of_kind(cls, value: Any, info: ValidationInfo) -> Any:
        """Each kind has its own metrics class; a dict (a stored record) is read as that class."""
        want = METRICS[info.data.get("kind", "train")]
        if isinstance(value, want):
            return value
        return want.model_validate(value.model_dump() if isinstance(value, BaseModel) else value)


def json_schema() -> dict[str, Any]:
    return ResultRecord.model_json_schema()


def flat_row(rec: ResultRecord) -> dict[str, Any]:
    """One flat row for CSV/Parquet: config.*, metrics.*, env.* columns (per-step loss list left out)."""
    row: dict[str, Any] = {k: getattr(rec, k) for k in ("id", "created_at", "kind", "status", "error", "sweep_id",
                                                        "config_hash")}
    row["tags"] = ",".join(rec.tags)
    row |= {f"config.{k}": _cell(v) for k, v in rec.config.items()}
    for k, v in rec.metrics.model_dump(exclude={"losses", "per_rank"}).items():
        if k == "step_time_s":
            row |= {f"metrics.step_time_{a}_s": b for a, b in (v or {}).items()}
        elif isinstance(v, dict):  # telemetry, scaling, busbw_peak_gbps, sections: one column per key
            row |= {f"metrics.{k}_{a}": _cell(b) for a, b in v.items()}
        elif v is not None or k not in ("telemetry", "scaling", "collectives_telemetry"):
            row[f"metrics.{k}"] = _cell(v)
    env = rec.environment
    gpu = env.get("gpu", {})
    row |= {"env.device": env.get("device"), "env.gpu": gpu.get("name"), "env.gpu_count": gpu.get("count"),
            "env.driver": env.get("driver"), "env.cuda": env.get("cuda"),
            "env.host": env.get("host", {}).get("hostname")}
    row |= {f"env.{k}": v for k, v in env.get("versions", {}).items()}
    row["env.git_commit"] = env.get("tunebench", {}).get("git_commit")
    return row


def _cell(v: Any) -> Any:
    """A value for one CSV/Parquet cell: lists of plain values joined, nested data as JSON."""
    if isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v):
        return ",".join(str(x) for x in v)
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return v
