"""`tunebench plan`: parse, call tunebench.api.plan, print the prediction (tables or JSON)."""

from __future__ import annotations

import argparse
import json

from tunebench.config import RunConfig, TrainConfig, read_yaml
from tunebench.flags import config_from


def plan_config(args: argparse.Namespace) -> tuple[RunConfig, bool]:
    """A run config, or the run part of a train config (a YAML with a `data` key), with the flags over it; and
    whether it is a train job that evaluates."""
    if args.config and "data" in (read_yaml(args.config) or {}):
        from tunebench.api.plan import evaluates, run_config

        job = config_from(args, TrainConfig).model_dump()
        return run_config(job), evaluates(job)
    return config_from(args), False


def cmd_plan(args: argparse.Namespace) -> int:
    from tunebench.api import plan as api
    from tunebench.commands.run import store_of, world_sizes
    from tunebench.console import print_table
    from tunebench.plan import view

    if args.calibration:
        for table in view.calibration_tables():
            print_table(table, args.stdout)
        return 0
    cfg, evaluating = plan_config(args)
    store = store_of(args)
    if args.compare:
        strategies = args.strategies.split(",") if args.strategies else None
        rows = api.compare(cfg, args.gpu, world_sizes(args.gpus), strategies, store, evaluating)
        if args.json:
            out = [{"strategy": r.strategy, "world_size": r.world, "refused": r.refused,
                    "prediction": r.prediction.as_dict() if r.prediction else None} for r in rows]
            print(json.dumps(out, indent=2), file=args.stdout)
        else:
            print_table(view.compare_table(rows), args.stdout)
        return 0
    p = api.plan(cfg, args.gpu, None, store, evaluating)
    if args.json:
        print(json.dumps(p.as_dict(), indent=2), file=args.stdout)
        return 0
    for table in (view.summary_table(p), view.memory_table(p), view.time_table(p)):
        print_table(table, args.stdout)
    return 0
