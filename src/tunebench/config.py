"""Run configuration: one validated pydantic model, read from YAML and/or CLI flags (flags win).

Everything that can be checked without building a model is checked here, so bad input fails in
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
Strategy = Literal["single", "ddp", "fsdp", "zero2", "zero3"]
# Where a run happens rather than what it is: left out of the config hash.
LAUNCH_ONLY = {"tag", "node_rank", "rdzv_endpoint", "rdzv_id", "timeout", "telemetry"}
BNB_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")


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
    steps: int = Field(20, gt=0, description="optimizer steps in total, warmup included")
    warmup: int = Field(10, ge=0, description="steps run first and never timed")
    optimizer: Optimizer = "adamw"
    lr: float = Field(2e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0, description="max grad norm; 0 disables clipping")
    grad_ckpt: bool = False
    attn: Literal["sdpa", "eager", "flash"] = "sdpa"
    compile: bool = False
    seed: int = 0
    device: Literal["auto", "cuda", "cpu"] = "auto"
    strategy: Strategy = "single"
    nproc_per_node: int | None = Field(None, gt=0, description="processes per node (default: all visible GPUs; "
                                                                "1 on CPU)")
    nnodes: int = Field(1, gt=0)
    node_rank: int = Field(0, ge=0)
    rdzv_endpoint: str | None = Field(None, description="HOST:PORT of the c10d rendezvous (multi-node)")
    rdzv_id: str | None = Field(None, description="rendezvous id shared by all nodes (default from the config)")
    timeout: float = Field(600.0, gt=0, description="collective timeout in seconds: a dead or stuck rank fails "
                                                    "the run after this")
    tag: list[str] = Field(default_factory=list, description="free-text labels stored with the record")
    telemetry: bool = Field(True, description="sample NVML (utilization, power, energy, clocks) over the "
                                              "timed steps on GPUs")
    fault: str | None = Field(None, pattern=r"^(abort|hang|raise)@\d+$",
                              description="testing the harness only: abort@STEP, hang@STEP or raise@STEP")

    @field_validator("lora_targets", "tag", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        if self.steps <= self.warmup:
            raise ValueError(f"steps={self.steps} must be greater than warmup={self.warmup} (warmup steps are not timed)")
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
        """Identity of the workload (tags excluded), used to match results across sweeps."""
        data = self.model_dump(exclude=LAUNCH_ONLY)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _is_endpoint(s: str) -> bool:
    host, _, port = s.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


FIELDS = tuple(RunConfig.model_fields)


def _one_line(err: ValidationError, raw: dict[str, Any]) -> str:
    """Turn pydantic's multi-line report into one line naming field, value and what is allowed."""
    e = err.errors()[0]
    field = ".".join(str(p) for p in e["loc"]) or "config"
    if e["type"] == "extra_forbidden":
        return f"unknown key {field!r} (allowed keys: {', '.join(FIELDS)})"
    msg = e["msg"].removeprefix("Value error, ")
    if not e["loc"]:  # model-level check: the message already names the fields
        return f"invalid config: {msg}"
    return str(invalid(field, e.get("input", raw.get(field)), msg))


def build_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise UserError(_one_line(err, data)) from None


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


def load_config(path: str | Path | None = None, **overrides: Any) -> RunConfig:
    """YAML file (optional) with keyword overrides laid over it; overrides set to None are ignored."""
    data = read_yaml(path) if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return build_config(data)
