"""TrainConfig: a real fine-tune on the user's data, with every RunConfig key plus data, schedule and output keys.

The run keys mean what they mean to `tunebench run` (the benchmark measured the same engine); `warmup`
is the number of first steps left out of the throughput figures, as there. The data keys are checked here
as far as can be without reading the data.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tunebench.config.base import LAUNCH, listify
from tunebench.config.run import MAX_STEPS, RunConfig
from tunebench.errors import UserError

DataFormat = Literal["auto", "text", "pairs", "chat", "preference"]
Schedule = Literal["cosine", "linear", "constant"]
TRACKERS = ("tensorboard", "mlflow", "wandb")


class TrainConfig(RunConfig):
    """`tunebench train`: fine-tune on local data with the benchmark's engine, checkpointed and resumable."""

    steps: int | None = Field(None, gt=0, le=MAX_STEPS, description="alias of max_steps")
    warmup: int = Field(5, ge=0, description="first steps left out of tokens/s and MFU (compilation, allocator)")
    data: str = Field(..., min_length=1, description="training data: a JSONL/JSON, CSV, Parquet or text file, a "
                                                     "folder of them, or a folder written by datasets' save_to_disk")
    data_format: DataFormat = Field("auto", description="text, pairs (prompt/completion), chat (messages) or "
                                                        "preference (prompt/chosen/rejected); auto: by the fields")
    text_field: str = Field("text", min_length=1, description="the field holding plain text")
    prompt_field: str = Field("prompt", min_length=1, description="the field holding a pair's prompt")
    completion_field: str = Field("completion", min_length=1, description="the field holding a pair's "
                                                                                 "completion")
    messages_field: str = Field("messages", min_length=1, description="the field holding a chat's messages "
                                                                             "(role and content)")
    chosen_field: str = Field("chosen", min_length=1, description="preference data: the preferred answer's field")
    rejected_field: str = Field("rejected", min_length=1, description="preference data: the other answer's field")
    train_on_prompt: bool = Field(False, description="pairs and chat: also train on the prompt / non-assistant tokens")
    strict_data: bool = Field(False, description="refuse the data at its first damaged row (a field missing, null or "
                                                 "not a string) instead of dropping and counting it")
    max_bad_rows: float = Field(0.1, ge=0, le=1, description="refuse the data when more than this share of its rows "
                                                             "is damaged")
    packing: bool | None = Field(None, description="pack several examples into one seq_len row (default: on for "
                                                   "text, off for pairs and chat)")
    eval_data: str | None = Field(None, description="validation data (same formats as data)")
    eval_fraction: float = Field(0.0, ge=0, lt=1, description="hold out this fraction of data for validation "
                                                               "(fixed seed) when there is no eval_data")
    eval_every: int = Field(0, ge=0, description="evaluate every N steps (0: at the end only, when there is "
                                                 "validation data)")
    eval_batches: int | None = Field(None, gt=0, description="at most this many batches per evaluation (default all)")
    tokenizer: str | None = Field(None, description="tokenizer directory (default: the model's own directory)")
    output_dir: str = Field("tunebench-output", description="checkpoints, the final adapter or model, the record",
                            json_schema_extra=LAUNCH)
    epochs: float = Field(1.0, gt=0, le=10_000, description="passes over the training data (max_steps wins)")
    max_steps: int | None = Field(None, gt=0, le=MAX_STEPS, description="stop after this many optimizer steps "
                                                                        "(wins over epochs)")
    schedule: Schedule = Field("cosine", description="the learning rate after warmup_steps, down to 0 at the end "
                                                     "(constant: held)")
    warmup_steps: int = Field(0, ge=0, description="learning-rate warmup steps (linear from 0)")
    log_every: int = Field(10, gt=0, description="a log line (loss, tokens/s, MFU, memory, ETA) every N steps")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)",
                            json_schema_extra=LAUNCH)
    keep_checkpoints: int = Field(2, gt=0, description="keep the last K checkpoints", json_schema_extra=LAUNCH)
    resume: str | None = Field(None, description="latest, auto (latest if there is one), or a checkpoint folder",
                               json_schema_extra=LAUNCH)
    overwrite: bool = Field(False, description="start anew in an output_dir that holds another run",
                            json_schema_extra=LAUNCH)
    merge: bool = Field(False, description="LoRA/QLoRA: also write the base with the adapter merged in")
    merge_dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="the merged model's dtype (the merge "
                                                                               "is computed in fp32, then cast)")
    track: list[str] = Field(default_factory=list, description="tensorboard, mlflow and/or wandb (local files in "
                                                               "output_dir; wandb also to its server)",
                             json_schema_extra=LAUNCH)
    target_eval_loss: float | None = Field(None, gt=0, description="record the time until eval loss reaches this")
    eval_tasks: list[str] = Field(default_factory=list, description="at the end, score the trained model and its "
                                                                    "base on these harness tasks (`tunebench eval`)",
                                  json_schema_extra=LAUNCH)
    eval_limit: float | None = Field(None, gt=0, description="with eval_tasks: examples per task (a count, or a "
                                                             "fraction below 1)", json_schema_extra=LAUNCH)

    @field_validator("eval_tasks", mode="before")
    @classmethod
    def _eval_tasks(cls, v: Any) -> Any:
        return listify(v)

    @field_validator("track", mode="before")
    @classmethod
    def _track(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        return [t.strip() for x in v for t in str(x).split(",") if t.strip()] if isinstance(v, list) else v

    @field_validator("track")
    @classmethod
    def _known_trackers(cls, v: list[str]) -> list[str]:
        unknown = [t for t in v if t not in TRACKERS]
        if unknown:
            raise ValueError(f"unknown tracker {unknown[0]!r}: use {', '.join(TRACKERS)}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> TrainConfig:  # replaces RunConfig's: steps are the data's, or max_steps
        if self.steps is not None and self.max_steps is None:
            object.__setattr__(self, "max_steps", self.steps)
        if self.max_steps is not None and self.max_steps <= self.warmup and "warmup" not in self.model_fields_set:
            object.__setattr__(self, "warmup", self.max_steps - 1)  # a short job: the default leaves one step timed
        if self.max_steps is not None and self.max_steps <= self.warmup:
            raise ValueError(f"max_steps={self.max_steps} must be greater than warmup={self.warmup} (the first "
                             "warmup steps are left out of tokens/s)")
        self._check_objective()
        if self.objective != "sft" and self.data_format not in ("auto", "preference"):
            raise ValueError(f"objective={self.objective} trains on preference pairs (prompt, chosen, rejected): "
                             f"data_format={self.data_format} has none")
        if self.objective == "sft" and self.data_format == "preference":
            raise ValueError("data_format=preference holds pairs of answers: train them with objective dpo, simpo or "
                             "orpo")
        if self.objective != "sft" and self.train_on_prompt:
            raise ValueError(f"train_on_prompt with objective={self.objective}: a preference objective compares the "
                             "answers alone")
        if self.eval_data and self.eval_fraction:
            raise ValueError("give eval_data or eval_fraction, not both")
        if self.resume not in (None, "latest", "auto") and not self.resume.strip():
            raise ValueError("resume must be latest, auto or a checkpoint folder")
        if not self.output_dir.strip():
            raise ValueError("output_dir is empty: name the folder the job writes into")
        if self.resume and self.overwrite:
            raise ValueError(f"resume={self.resume} with overwrite: overwrite deletes the checkpoints resume continues "
                             "from; give one of them")
        return self._check_shape_and_nodes()

    def total_steps(self, rows: int, world: int) -> int:
        """The job's optimizer steps over `rows` prepared rows on `world` processes (max_steps, else the epochs)."""
        micro_per_epoch = rows // (self.batch_size * world)
        if micro_per_epoch == 0:
            raise UserError(f"invalid batch_size={self.batch_size}: the data makes {rows} rows of {self.seq_len} "
                            f"tokens, fewer than one global batch of {self.batch_size * world}")
        return self.max_steps or max(1, round(self.epochs * micro_per_epoch / self.grad_accum))

    def run_config(self) -> RunConfig:
        """The benchmark configuration of this job: what `tunebench run` measures for it."""
        keys = set(RunConfig.model_fields) - {"steps", "warmup"}
        return RunConfig.model_validate({k: getattr(self, k) for k in keys} | {"steps": 20, "warmup": 10})

    def identity_config(self) -> RunConfig:
        """The configuration a checkpoint of this job is identified by (resume): its benchmark's, any injected
        fault left out."""
        return self.run_config().model_copy(update={"fault": None})
