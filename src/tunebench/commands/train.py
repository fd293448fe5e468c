"""`tunebench train`: parse, call tunebench.api.train, print."""

from __future__ import annotations

import argparse


def cmd_train(args: argparse.Namespace) -> int:
    from tunebench.config import TrainConfig
    from tunebench.flags import config_from

    cfg = config_from(args, TrainConfig)  # bad input is refused here, before torch is imported
    from tunebench.api.train import PREEMPTED, train
    from tunebench.commands.run import store_of
    from tunebench.console import print_table
    from tunebench.report.views import run_table

    rec = train(cfg, store_of(args))
    if rec is None:
        return 0
    if args.json:
        print(rec.model_dump_json(indent=2), file=args.stdout)
    else:
        print_table(run_table(rec), args.stdout)
    if args.print_result:
        from tunebench.deploy.command import marked

        print(marked(rec.model_dump_json()), file=args.stdout, flush=True)
    job = rec.metrics.job
    if job is not None and job.exit == "preempted":
        return PREEMPTED
    return 0 if rec.status == "ok" else 1
