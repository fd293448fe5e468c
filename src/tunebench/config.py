"""Configurations: one validated pydantic model per command, read from YAML and/or CLI flags (flags win).

RunConfig is a training benchmark; HwConfig, LoadConfig and InferConfig are `tunebench hw`, `load`
and `infer`. Everything that can be checked without building a model is checked here, so bad input fails in
well under a second with one line naming the field, the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tunebench.errors import UserError, invalid

Method = Literal["full", "lora", "qlora"]
Precision = Literal["bf16", "fp16", "fp32"]
Optimizer = Literal["adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit"]
Strategy = Literal["single", "ddp", "fsdp", "zero2", "zero3"]  # tunebench.strategies registers each
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")

# A run's identity, declared once on its fields. Every field is part of the workload unless marked:
#   launch:      where and how it runs (tags, rendezvous, timeouts): left out of the config hash;
#   measurement: how it is measured (seed, steps, device): in the hash, but not a lever a report compares.
# The config hash (sweep resume, compare, report grouping) and the report's levers derive from this.
LAUNCH = {"role": "launch"}
MEASUREMENT = {"role": "measurement"}


def fields_with_role(cls: type[BaseModel], *roles: str) -> set[str]:
    return {n for n, f in cls.model_fields.items() if (f.json_schema_extra or {}).get("role") in roles}


def identity(cls: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """The part of a config (as a dict) that says what the workload is: launch fields removed."""
    launch = fields_with_role(cls, "launch")
    return {k: v for k, v in data.items() if k not in launch}


def not_levers(cls: type[BaseModel]) -> set[str]:
    """Fields two configurations may differ in without being different experiments."""
    return fields_with_role(cls, "launch", "measurement")


class RunConfig(BaseModel):
    """One training benchmark. Field names are the YAML keys; CLI flags are the same with dashes."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str = Field("tiny-llama", description="preset name or local Hugging Face model directory")
    method: Method = "full"
    lora_rank: int = Field(16, gt=0)
    lora_alpha: float = Field(32.0, gt=0)
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    lora_targets: list[str] = Field(default_factory=lambda: ["all-linear"])
    quant: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    quant_compute_dtype: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    precision: Precision = "bf16"
    batch_size: int = Field(1, gt=0, description="micro-batch per device")
    grad_accum: int = Field(1, gt=0)
    seq_len: int = Field(512, gt=0)
    steps: int = Field(20, gt=0, description="optimizer steps in total, warmup included", json_schema_extra=MEASUREMENT)
    warmup: int = Field(10, ge=0, description="steps run first and never timed", json_schema_extra=MEASUREMENT)
    optimizer: Optimizer = "adamw"
    lr: float = Field(2e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0, description="max grad norm; 0 disables clipping")
    grad_ckpt: bool = False
    attn: Literal["sdpa", "eager", "flash"] = "sdpa"
    compile: bool = False
    seed: int = Field(0, json_schema_extra=MEASUREMENT)
    device: Literal["auto", "cuda", "cpu"] = Field("auto", json_schema_extra=MEASUREMENT)
    strategy: Strategy = "single"
    nproc_per_node: int | None = Field(None, gt=0, description="processes per node (default: all visible GPUs; "
                                                                "1 on CPU)")
    nnodes: int = Field(1, gt=0)
    node_rank: int = Field(0, ge=0, json_schema_extra=LAUNCH)
    rdzv_endpoint: str | None = Field(None, description="HOST:PORT of the c10d rendezvous (multi-node)",
                                      json_schema_extra=LAUNCH)
    rdzv_id: str | None = Field(None, description="rendezvous id shared by all nodes (default from the config)",
                                json_schema_extra=LAUNCH)
    timeout: float = Field(600.0, gt=0, description="collective timeout in seconds: a dead or stuck rank fails "
                                                    "the run after this", json_schema_extra=LAUNCH)
    tag: list[str] = Field(default_factory=list, description="free-text labels stored with the record",
                           json_schema_extra=LAUNCH)
    telemetry: bool = Field(True, description="sample NVML (utilization, power, energy, clocks) over the "
                                              "timed steps on GPUs", json_schema_extra=LAUNCH)
    fault: str | None = Field(None, pattern=r"^(abort|hang|raise)@\d+$",
                              description="testing the harness only: abort@STEP, hang@STEP or raise@STEP")

    @field_validator("lora_targets", "tag", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        if self.steps <= self.warmup:
            raise ValueError(f"steps={self.steps} must be greater than warmup={self.warmup} "
                             "(warmup steps are not timed)")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} must be below nnodes={self.nnodes}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError(f"nnodes={self.nnodes} needs rdzv_endpoint=HOST:PORT (the rendezvous on the first node)")
        if self.rdzv_endpoint and not _is_endpoint(self.rdzv_endpoint):
            raise ValueError(f"rdzv_endpoint={self.rdzv_endpoint} must be HOST:PORT")
        return self

    @property
    def distributed(self) -> bool:
        """Runs under torchrun: any strategy but single, or more than one process."""
        return self.strategy != "single" or (self.nproc_per_node or 1) > 1 or self.nnodes > 1

    def config_hash(self) -> str:
        """Identity of the workload (launch fields excluded), used to match results across sweeps."""
        return config_hash(identity(type(self), self.model_dump()))


def config_hash(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_bytes(v: Any) -> Any:
    """'32K', '1M', '1G' (binary, as nccl-tests reads -b/-e) or a plain integer number of bytes."""
    if isinstance(v, str):
        t = v.strip().upper().removesuffix("IB").removesuffix("B")
        unit = t[-1:] if t[-1:] in UNITS else ""
        if not t[: len(t) - len(unit)].isdigit():
            raise ValueError(f"{v!r} is not a size (use bytes or a number with K, M or G)")
        return int(t[: len(t) - len(unit)]) * UNITS[unit]
    return v


def _listify(v: Any) -> Any:
    """A list from YAML, a repeated flag, or one comma-separated string ('bf16,nf4', '1,8,32')."""
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return [y.strip() for x in v for y in x.split(",") if y.strip()]
    return v


BenchPrecision = Literal["bf16", "fp16", "int8", "nf4", "fp4"]
HwSection = Literal["matmul", "bandwidth", "collectives"]


class _BenchConfig(BaseModel):
    """What hw, load and infer share: where they run, telemetry, tags."""

    model_config = ConfigDict(extra="forbid")

    device: Literal["auto", "cuda", "cpu"] = Field("auto", json_schema_extra=MEASUREMENT)
    telemetry: bool = Field(True, description="sample NVML (utilization, power, energy, clocks) on GPUs",
                            json_schema_extra=LAUNCH)
    tag: list[str] = Field(default_factory=list, description="free-text labels stored with the records",
                           json_schema_extra=LAUNCH)

    @field_validator("tag", mode="before")
    @classmethod
    def _tags(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    def config_hash(self) -> str:
        return config_hash(identity(type(self), self.model_dump()))

    def record_config(self, **one: object) -> tuple[dict[str, Any], str]:
        """One record's config (the lists the command iterates replaced by this record's values) and its hash."""
        data = self.model_dump(exclude={"precisions", "batch_sizes"}) | one
        return data, config_hash(identity(type(self), data))


class HwConfig(_BenchConfig):
    """`tunebench hw`: matmul (MAMF), memory bandwidths, collectives."""

    quick: bool = Field(False, description="the one-minute version: fewer shapes, sizes and iterations")
    sections: list[HwSection] = Field(default_factory=lambda: ["matmul", "bandwidth", "collectives"],
                                      description="what to measure, comma-separated: matmul, bandwidth, "
                                                  "collectives (default all)")
    dtypes: list[Literal["bf16", "fp16", "tf32", "fp8", "fp32"]] | None = Field(
        None, description="matmul dtypes, comma-separated (default: bf16, fp16, tf32 and fp8 where the GPU has "
                          "it; fp32, bf16 on CPU)")
    nproc: int | None = Field(None, ge=2, description="processes for the collectives (default: every GPU; 2 on CPU)")
    min_size: int = Field(32 * 2**10, gt=0, description="smallest collective buffer (default 32K)")
    max_size: int | None = Field(None, gt=0, description="largest collective buffer (default 1G; 32M for --quick "
                                                         "on CPU)")
    iters: int | None = Field(None, gt=0, description="timed iterations per measurement (default 100, 20 quick)")
    timeout: float = Field(600.0, gt=0, description="seconds the collectives may take before they are stopped")

    @field_validator("min_size", "max_size", mode="before")
    @classmethod
    def _sizes(cls, v: Any) -> Any:
        return parse_bytes(v)

    @field_validator("sections", "dtypes", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return _listify(v)

    @model_validator(mode="after")
    def _check(self) -> HwConfig:
        if self.max_size is not None and self.max_size < self.min_size:
            raise ValueError(f"max_size={self.max_size} must be at least min_size={self.min_size}")
        return self


class _ModelBenchConfig(_BenchConfig):
    model: str = Field("tiny-llama", description="preset name or local Hugging Face model directory")
    precisions: list[BenchPrecision] = Field(default_factory=lambda: ["bf16", "int8", "nf4"],
                                             description="weights, comma-separated: bf16, fp16, int8 (LLM.int8), "
                                                         "nf4, fp4")
    double_quant: bool = Field(True, description="4-bit: quantize the quantization constants too")
    attn: Literal["sdpa", "eager", "flash"] = "sdpa"
    seed: int = Field(0, json_schema_extra=MEASUREMENT)

    @field_validator("precisions", mode="before")
    @classmethod
    def _precisions(cls, v: Any) -> Any:
        return _listify(v)


class LoadConfig(_ModelBenchConfig):
    """`tunebench load`: load time and memory per precision."""

    cache: Literal["warm", "cold"] = Field("warm", description="warm: files read once before timing; cold: "
                                                               "evicted from the page cache before each load")
    workdir: str | None = Field(None, description="where a preset is written as safetensors first (default: a "
                                                  "temporary directory, removed after)")


class InferConfig(_ModelBenchConfig):
    """`tunebench infer`: greedy generation per precision and batch size."""

    precisions: list[BenchPrecision] = Field(default_factory=lambda: ["bf16", "nf4"],
                                             description="weights, comma-separated: bf16, fp16, int8 (LLM.int8), "
                                                         "nf4, fp4")
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64],
                                   description="comma-separated (default 1,2,4,8,16,32,64)")
    prompt_len: int = Field(128, gt=0, description="prompt tokens per sequence")
    new_tokens: int = Field(128, ge=2, description="tokens generated per sequence (always all of them)")
    kv_cache: Literal["dynamic", "static"] = Field("dynamic", description="static: preallocated (needed by compile)")
    compile: bool = Field(False, description="torch.compile the decode step (CUDA graphs on GPUs); needs static cache")
    warmup: int = Field(1, ge=0, description="untimed generations first")
    repeats: int = Field(3, gt=0, description="timed generations; the record holds their medians")

    @field_validator("batch_sizes", mode="before")
    @classmethod
    def _batch_sizes(cls, v: Any) -> Any:
        return _listify(v)

    @model_validator(mode="after")
    def _check(self) -> InferConfig:
        if self.compile and self.kv_cache != "static":
            raise ValueError("compile=true needs kv_cache=static (a growing cache would recompile every step)")
        if any(b <= 0 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes={self.batch_sizes} must be positive")
        return self


def _is_endpoint(s: str) -> bool:
    host, _, port = s.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


FIELDS = tuple(RunConfig.model_fields)


def _one_line(err: ValidationError, raw: dict[str, Any], fields: tuple[str, ...] = FIELDS) -> str:
    """Turn pydantic's multi-line report into one line naming field, value and what is allowed."""
    e = err.errors()[0]
    loc = [p for p in e["loc"] if not isinstance(p, int)]  # a list item's index is not a field
    field = ".".join(str(p) for p in loc) or "config"
    if e["type"] == "extra_forbidden":
        return f"unknown key {field!r} (allowed keys: {', '.join(fields)})"
    msg = e["msg"].removeprefix("Value error, ")
    if not e["loc"]:  # model-level check: the message already names the fields
        return f"invalid config: {msg}"
    return str(invalid(field, raw.get(field, e.get("input")), msg))


def build_config(data: dict[str, Any], cls: type[BaseModel] = RunConfig) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise UserError(_one_line(err, data, tuple(cls.model_fields))) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"config file {str(p)!r} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {str(p)!r} must hold a mapping of keys to values, not {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, cls: type[BaseModel] = RunConfig, **overrides: Any) -> Any:
    """YAML file (optional) with keyword overrides laid over it; overrides set to None are ignored."""
    data = read_yaml(path) if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return build_config(data, cls)
