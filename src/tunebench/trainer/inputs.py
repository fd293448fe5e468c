"""What the launching process prepares for a training job's ranks: light, so that it imports no engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class JobInputs:
    """What the parent prepared for the ranks (it travels as JSON in the run directory)."""

    data: str  # the prepared training rows (a cache folder)
    eval: str | None  # the prepared validation rows
    tokenizer: str  # the job's copy of its tokenizer (output_dir/tokenizer), saved beside the outputs
    total: int  # optimizer steps planned
    identity: dict[str, Any]  # what a checkpoint must match to be resumed
    resume: str | None = None  # the checkpoint folder to continue from
    prediction: dict[str, Any] | None = None  # tokens_per_s and where it came from
    generation: dict[str, Any] | None = None  # the saved model's generation config, resolved at the start

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobInputs:
        return cls(**d)
