"""Configuration of `tunebench eval`: a model's scores on lm-evaluation-harness tasks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tunebench.config.base import LAUNCH, MAX_SEED, MEASUREMENT, Tags, config_hash, identity, listify


class EvalConfig(BaseModel):
    """`tunebench eval MODEL|OUTPUT_DIR --tasks T1,T2`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(..., description="a model folder, a peft adapter folder, or a `tunebench train` output_dir")
    tasks: list[str] = Field(..., min_length=1, description="harness task names and/or local task YAML files, "
                                                            "comma-separated")
    limit: float | None = Field(None, gt=0, description="examples per task: a count, or a fraction below 1 "
                                                        "(default all)")
    num_fewshot: int | None = Field(None, ge=0, description="examples shown before each question (default the "
                                                            "task's)")
    apply_chat_template: bool = Field(False, description="render each prompt with the tokenizer's chat template")
    base: bool = Field(True, description="for an output_dir: also score the base model the job started from")
    download: bool = Field(False, description="let the harness download task datasets (default: the local cache)",
                           json_schema_extra=LAUNCH)
    batch_size: int = Field(8, gt=0, le=4096, description="requests per forward pass")
    precision: Literal["auto", "bf16", "fp16", "fp32"] = Field("auto", description="weights' dtype (auto: bf16 "
                                                                                   "on GPUs, fp32 on the CPU)")
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="auto: a GPU where there is one",
                                                   json_schema_extra=MEASUREMENT)
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of few-shot sampling and the harness",
                      json_schema_extra=MEASUREMENT)
    tag: Tags = Field(default_factory=list, description="free-text labels stored with the records",
                           json_schema_extra=LAUNCH)

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks(cls, v: Any) -> Any:
        return listify(v)

    @field_validator("limit")
    @classmethod
    def _limit(cls, v: float | None) -> float | None:
        if v is not None and v >= 1 and v != int(v):
            raise ValueError(f"limit={v}: give a whole count or a fraction below 1")
        return int(v) if v is not None and v >= 1 else v

    def record_config(self, **one: object) -> tuple[dict[str, Any], str]:
        """One record's config (one task, one model) and its hash."""
        data = self.model_dump() | one
        return data, config_hash(identity(type(self), data))
