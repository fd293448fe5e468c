"""`tunebench train`: parse, call tunebench.api.train, print."""

from __future__ import annotations

import argparse


def cmd_train(args: argparse.Namespace) -> int:
    from tunebench.config import TrainConfig
    from tunebench.flags import config_from

    cfg = config_from(args, TrainConfig)  # bad input is refused here, before torch is imported
    from tunebench.api.train import PREEMPTED, train
    from tunebench.commands.run import print_record, store_of

    rec = train(cfg, store_of(args))
    if rec is None:
        return 0
    print_record(rec, args)
    job = rec.metrics.job
    if job is not None and job.exit == "preempted":
        return PREEMPTED
    return 0 if rec.status == "ok" else 1
