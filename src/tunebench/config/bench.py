"""Configurations of `tunebench hw`, `load` and `infer`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tunebench.config.base import LAUNCH, MAX_SEED, MEASUREMENT, Tags, config_hash, identity, listify, parse_bytes

BenchPrecision = Literal["bf16", "fp16", "int8", "nf4", "fp4"]
HwSection = Literal["host", "matmul", "bandwidth", "collectives"]


class _BenchConfig(BaseModel):
    """What hw, load and infer share: where they run, telemetry, tags."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="auto: a GPU where there is one",
                                                   json_schema_extra=MEASUREMENT)
    telemetry: bool = Field(True, description="sample NVML (utilization, power, energy, clocks) on GPUs",
                            json_schema_extra=LAUNCH)
    tag: Tags = Field(default_factory=list, description="free-text labels stored with the records",
                           json_schema_extra=LAUNCH)

    def config_hash(self) -> str:
        return config_hash(identity(type(self), self.model_dump()))

    def record_config(self, **one: object) -> tuple[dict[str, Any], str]:
        """One record's config (the lists the command iterates replaced by this record's values) and its hash."""
        data = self.model_dump(exclude={"precisions", "batch_sizes"}) | one
        return data, config_hash(identity(type(self), data))


class HwConfig(_BenchConfig):
    """`tunebench hw`: matmul (MAMF), memory bandwidths, collectives."""

    quick: bool = Field(False, description="the one-minute version: fewer shapes, sizes and iterations")
    sections: list[HwSection] = Field(default_factory=lambda: ["host", "matmul", "bandwidth", "collectives"],
                                      description="what to measure, comma-separated: host, matmul, bandwidth, "
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
        return listify(v)

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
    attn: Literal["sdpa", "eager", "flash"] = Field("sdpa", description="attention implementation")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seed of the random weights",
                      json_schema_extra=MEASUREMENT)

    @field_validator("precisions", mode="before")
    @classmethod
    def _precisions(cls, v: Any) -> Any:
        return listify(v)


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
        return listify(v)

    @model_validator(mode="after")
    def _check(self) -> InferConfig:
        if self.compile and self.kv_cache != "static":
            raise ValueError("compile=true needs kv_cache=static (a growing cache would recompile every step)")
        if any(b <= 0 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes={self.batch_sizes} must be positive")
        return self
