"""The Python API: one lifecycle for every run, used by the CLI, sweeps and tests alike.

    run(cfg, store)                  one configuration: checked, launched here or under torchrun, saved
    run_scaling(cfg, sizes, store)   the same per-GPU configuration at each world size, with efficiency
    plan_sweep / resume_plan / run_sweep   a suite, each configuration isolated, resumable
    quick(device, store, out)        the quick benchmark and its report
    finalize(rec, store)             the one place a new result is stamped and saved
    plan(cfg, gpu) / compare(...)    predictions before anything runs (tunebench.api.plan)

Launching is tunebench.launch's business; the model, method, strategy and loop are the engine's.
Names are imported on first use, so `tunebench plan` never loads torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "quick": "quick", "quick_configs": "quick",
    "finalize": "records", "import_records": "records",
    "run": "runs", "run_scaling": "runs",
    "check_sweep": "sweep", "pending": "sweep", "plan_sweep": "sweep", "refusals": "sweep", "register": "sweep",
    "resume_plan": "sweep", "run_each_gpu": "sweep", "run_sweep": "sweep", "run_task": "sweep",
    "sweep_lock": "sweep", "sweep_records": "sweep", "task_index": "sweep",
    "DEFAULT_RUN_TIMEOUT": "tunebench.launch.isolated",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'tunebench.api' has no attribute {name!r}")
    module = importlib.import_module(where if "." in where else f"{__name__}.{where}")
    return getattr(module, name)
