"""`tunebench hw`, `load`, `infer` and `eval`: each record is stored as soon as it exists."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable

from tunebench.config import EvalConfig, HwConfig, InferConfig, LoadConfig
from tunebench.console import say
from tunebench.document import Table
from tunebench.flags import config_from
from tunebench.record import ResultRecord


def _finish(args: argparse.Namespace, records: Iterable[ResultRecord],
            tables: Callable[[list[ResultRecord]], list[Table]]) -> int:
    """Store each record as it arrives, then print them (JSON or tables); exit 1 unless all are ok."""
    from tunebench.api import finalize
    from tunebench.console import print_table
    from tunebench.store import check_store, default_store_path

    store = None if args.no_store else (args.store or default_store_path())
    if store:
        check_store(store)
    done = [finalize(rec, store) for rec in records]
    if args.json:
        print(json.dumps([json.loads(r.model_dump_json()) for r in done], indent=2), file=args.stdout)
    else:
        for table in tables(done):
            print_table(table, args.stdout)
    saved = sum(r.saved_to is not None for r in done)
    if store:
        say(f"stored {saved} of {len(done)} result(s) in {store}")
    return 0 if done and all(r.status == "ok" for r in done) else 1


def cmd_hw(args: argparse.Namespace) -> int:
    from tunebench.hw import preflight, run_hw
    from tunebench.report.bench import hw_tables

    cfg = config_from(args, HwConfig)
    preflight(cfg)
    return _finish(args, [run_hw(cfg, say)], lambda recs: [t for r in recs for t in hw_tables(r)])


def cmd_load(args: argparse.Namespace) -> int:
    from tunebench.inference.load import preflight, run_load
    from tunebench.report.bench import load_table

    cfg = config_from(args, LoadConfig)
    preflight(cfg)
    return _finish(args, run_load(cfg, say), lambda recs: [load_table(recs)])


def cmd_infer(args: argparse.Namespace) -> int:
    from tunebench.inference.generate import preflight, run_infer
    from tunebench.report.bench import infer_table

    cfg = config_from(args, InferConfig)
    preflight(cfg)
    return _finish(args, run_infer(cfg, say), lambda recs: [infer_table(recs)])


def cmd_eval(args: argparse.Namespace) -> int:
    from tunebench.errors import UserError
    from tunebench.evaluate import preflight, run_eval
    from tunebench.evaluate.tasks import build
    from tunebench.report.bench import eval_table

    if args.target and args.model and args.target != args.model:
        raise UserError(f"invalid model={args.model}: the model is given twice ({args.target} and --model)")
    cfg = config_from(args, EvalConfig, **({"model": args.target} if args.target else {}))
    preflight(cfg, lambda line: None)  # bad input before the store is touched
    tasks = build(cfg.tasks, cfg.download)
    return _finish(args, run_eval(cfg, say, tasks=tasks), lambda recs: [eval_table(recs)])
