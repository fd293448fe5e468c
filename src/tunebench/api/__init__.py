"""The Python API: one lifecycle for every run, used by the CLI, sweeps and tests alike.

    run(cfg, store)                  one configuration: checked, launched here or under torchrun, saved
    run_scaling(cfg, sizes, store)   the same per-GPU configuration at each world size, with efficiency
    plan_sweep / resume_plan / run_sweep   a suite, each configuration isolated, resumable
    quick(device, store, out)        the quick benchmark and its report
    finalize(rec, store)             the one place a new result is stamped and saved

Launching is tunebench.launch's business; the model, method, strategy and loop are the engine's.
"""

from tunebench.api.quick import quick, quick_configs
from tunebench.api.records import finalize, import_records
from tunebench.api.runs import run, run_scaling
from tunebench.api.sweep import (
           check_sweep,
           pending,
           plan_sweep,
           refusals,
    register,
           resume_plan,
           run_each_gpu,
           run_sweep,
    run_task,
           sweep_lock,
           sweep_records,
    task_index,
)
from tunebench.launch.isolated import DEFAULT_RUN_TIMEOUT

__all__ = ["DEFAULT_RUN_TIMEOUT", "check_sweep", "finalize", "import_records", "pending", "plan_sweep", "quick",
           "quick_configs", "refusals", "register", "resume_plan", "run", "run_each_gpu", "run_scaling", "run_sweep",
           "run_task", "sweep_lock", "sweep_records", "task_index"]
