"""`tunebench hw`, `tunebench load` and `tunebench infer`: each record is stored as soon as it exists."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable

from tunebench.config import HwConfig, InferConfig, LoadConfig, load_config
from tunebench.document import Table
from tunebench.record import ResultRecord


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _config(args: argparse.Namespace, cls):
    return load_config(args.config, cls, **{name: getattr(args, name) for name in cls.model_fields})


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
    if store:
        _log(f"stored {len(done)} result(s) in {store}")
    return 0 if done and all(r.status == "ok" for r in done) else 1


def cmd_hw(args: argparse.Namespace) -> int:
    from tunebench.hw import preflight, run_hw
    from tunebench.report.bench import hw_tables

    cfg = _config(args, HwConfig)
    preflight(cfg)
    return _finish(args, [run_hw(cfg, _log)], lambda recs: [t for r in recs for t in hw_tables(r)])


def cmd_load(args: argparse.Namespace) -> int:
    from tunebench.inference.load import preflight, run_load
    from tunebench.report.bench import load_table

    cfg = _config(args, LoadConfig)
    preflight(cfg)
    return _finish(args, run_load(cfg, _log), lambda recs: [load_table(recs)])


def cmd_infer(args: argparse.Namespace) -> int:
    from tunebench.inference.generate import preflight, run_infer
    from tunebench.report.bench import infer_table

    cfg = _config(args, InferConfig)
    preflight(cfg)
    return _finish(args, run_infer(cfg, _log), lambda recs: [infer_table(recs)])
