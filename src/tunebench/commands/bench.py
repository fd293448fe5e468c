"""`tunebench hw`, `tunebench load` and `tunebench infer`: each record is stored as soon as it exists."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterable

from tunebench.config import HwConfig, InferConfig, LoadConfig, load_config
from tunebench.record import ResultRecord


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _config(args: argparse.Namespace, cls):
    return load_config(args.config, cls, **{name: getattr(args, name) for name in cls.model_fields})


def _finish(args: argparse.Namespace, records: Iterable[ResultRecord], tables) -> int:
    """Store each record as it arrives, then print them (JSON or tables); exit 1 unless all are ok."""
    from rich.console import Console

    from tunebench.report.summary import print_table
    from tunebench.store import Store, default_store_path

    store_path = None if args.no_store else (args.store or default_store_path())
    done: list[ResultRecord] = []
    with Store(store_path) if store_path else contextlib.nullcontext() as store:
        for rec in records:
            if store:
                store.save(rec)
            done.append(rec)
    if args.json:
        print(json.dumps([json.loads(r.model_dump_json()) for r in done], indent=2), file=args.stdout)
    else:
        console = Console(file=args.stdout)
        for table in tables(done):
            print_table(table, console)
    if store_path:
        _log(f"stored {len(done)} result(s) in {store_path}")
    return 0 if done and all(r.status == "ok" for r in done) else 1


def cmd_hw(args: argparse.Namespace) -> int:
    from tunebench.hw import preflight, run_hw
    from tunebench.report.bench import hw_tables, rich_table

    cfg = _config(args, HwConfig)
    preflight(cfg)
    return _finish(args, [run_hw(cfg, _log)], lambda recs: [rich_table(*t) for r in recs for t in hw_tables(r)])


def cmd_load(args: argparse.Namespace) -> int:
    from tunebench.inference.load import preflight, run_load
    from tunebench.report.bench import load_table, rich_table

    cfg = _config(args, LoadConfig)
    preflight(cfg)
    return _finish(args, run_load(cfg, _log), lambda recs: [rich_table(*load_table(recs))])


def cmd_infer(args: argparse.Namespace) -> int:
    from tunebench.inference.generate import preflight, run_infer
    from tunebench.report.bench import infer_table, rich_table

    cfg = _config(args, InferConfig)
    preflight(cfg)
    return _finish(args, run_infer(cfg, _log), lambda recs: [rich_table(*infer_table(recs))])
