"""Configurations: one validated pydantic model per command, read from YAML and/or CLI flags (flags win).

    base.py    field roles (a run's identity and hash), YAML, one-line errors
    run.py     RunConfig, a training benchmark
    train.py   TrainConfig, a fine-tune on local data (every RunConfig key, plus data and output)
    bench.py   HwConfig, LoadConfig, InferConfig (`tunebench hw`, `load`, `infer`)
    evaluation.py  EvalConfig (`tunebench eval`)

Nothing here imports torch: checking a configuration takes well under a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tunebench.config import base
from tunebench.config.base import (
    LAUNCH,
    MEASUREMENT,
    build_config,
    config_hash,
    fields_with_role,
    identity,
    not_levers,
    parse_bytes,
    read_yaml,
    workload_key,
)
from tunebench.config.bench import HwConfig, InferConfig, LoadConfig
from tunebench.config.evaluation import EvalConfig
from tunebench.config.run import (
    BNB_OPTIMIZERS,
    PACKED_ELEMENTS,
    Method,
    Objective,
    Optimizer,
    Precision,
    RunConfig,
    Strategy,
)
from tunebench.config.train import TrainConfig

__all__ = ["BNB_OPTIMIZERS", "LAUNCH", "MEASUREMENT", "PACKED_ELEMENTS",
           "EvalConfig", "HwConfig", "InferConfig", "LoadConfig", "Method",
           "Objective", "Optimizer", "Precision", "RunConfig", "Strategy", "TrainConfig", "build_config", "config_hash",
           "fields_with_role", "identity", "load_config", "not_levers", "parse_bytes", "read_yaml", "workload_key"]


def load_config(path: str | Path | None = None, cls: type[BaseModel] = RunConfig, **overrides: Any) -> Any:
    """YAML file (optional) with keyword overrides laid over it; overrides set to None are ignored."""
    return base.load_config(path, cls, **overrides)
