"""The `tunebench run ...` (or `sweep ...`) of a deployment, checked here as it will be checked on the cluster.

The arguments are parsed by `run`'s own parser and validated as a RunConfig with the deployment's node and
GPU counts, against the strategy registry and the model's shape: a configuration that would fail at pod
start (strategy single with 32 processes, say) is refused before any manifest is written. What only exists
on the cluster (a local model directory, a config file in the image) is not looked for here.
"""

from __future__ import annotations

from pathlib import Path

from tunebench.errors import UserError


def check_run_args(args: list[str], nodes: int, gpus: int, command: str = "run") -> None:
    """`run` or `train` arguments (a training job's data and output live on the cluster's volume: not looked for)."""
    from tunebench.config import RunConfig, TrainConfig
    from tunebench.flags import config_from, parse_run
    from tunebench.models.spec import resolve_model
    from tunebench.strategies import STRATEGIES

    ns = parse_run(args, command)
    if getattr(ns, "gpus", None):
        raise UserError("--gpus (a scaling series) runs on one machine; deploy one world size at a time")
    if ns.config and not Path(ns.config).is_file():
        ns.config = None  # a file in the image or on a volume: its keys are checked when the pod starts
    fixed = {"nproc_per_node": gpus, "nnodes": nodes, "device": "cuda",
             "rdzv_endpoint": "first-node:29400" if nodes > 1 else None}
    try:
        cfg = config_from(ns, TrainConfig if command == "train" else RunConfig, **fixed)
    except UserError as err:
        raise UserError(f"in the {command} arguments: {err}") from None
    STRATEGIES[cfg.strategy].check(cfg, nodes * gpus, packages=False)  # the image has the packages, not this host
    local = any(c in cfg.model for c in "/~.")
    if not local:
        spec = resolve_model(cfg.model)
        if spec.max_positions and cfg.seq_len > spec.max_positions:
            raise UserError(f"in the run arguments: invalid seq_len={cfg.seq_len}: above the model's maximum of "
                            f"{spec.max_positions} positions")


def check_sweep_args(args: list[str]) -> None:
    from tunebench.suites import expand, load_suite, parse_sets

    ref = next((a for a in args if not a.startswith("-")), None)
    if ref is None:
        raise UserError("in the sweep arguments: give a suite (a built-in name or a YAML file)")
    if Path(ref).suffix in (".yaml", ".yml") and not Path(ref).is_file():
        return  # a suite file in the image or on a volume: checked when the pod starts
    sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
    expand(load_suite(ref), parse_sets(sets))
