"""The command line: a thin layer over the Python API (tunebench.run, tunebench.Store)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, Sequence, get_origin

from tunebench.config import RunConfig
from tunebench.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 2, no usage dump
        raise UserError(message)


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field, same name with dashes; None means 'not given' so YAML keeps its value."""
    for name, field in RunConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_ = field.description or ""
        if field.annotation is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif get_origin(field.annotation) is list:
            p.add_argument(flag, dest=name, action="append", default=None, help=help_ + " (repeatable)")
        else:
            p.add_argument(flag, dest=name, default=None, help=f"{help_} (default {field.default})".strip())


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, help="results database (default $TUNEBENCH_STORE or "
                                                  "./tunebench-results/results.db)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tunebench", description="Benchmark and run LLM fine-tuning.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run one training benchmark and store its record")
    run.add_argument("config", nargs="?", help="YAML run config; flags override its keys")
    _add_config_flags(run)
    run.add_argument("--json", action="store_true", help="print the record as JSON on stdout")
    run.add_argument("--no-store", action="store_true", help="do not write the record to the store")
    _store_arg(run)

    quick = sub.add_parser("quick", help="a quick benchmark sized for this machine, with a comparison table")
    quick.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    _store_arg(quick)

    res = sub.add_parser("results", help="list, show or export stored results")
    rsub = res.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ls = rsub.add_parser("list", help="one line per stored result")
    ls.add_argument("--kind")
    ls.add_argument("--sweep")
    show = rsub.add_parser("show", help="one result's full record as JSON")
    show.add_argument("id", help="result id or a unique prefix of it")
    exp = rsub.add_parser("export", help="all results as CSV or JSON lines")
    exp.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    exp.add_argument("-o", "--output", help="file to write (default stdout)")
    rsub.add_parser("schema", help="print the result record's JSON schema")
    for p in (ls, show, exp):
        _store_arg(p)
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunebench.config import load_config
    from tunebench.report.summary import print_table, run_table
    from tunebench.runner import preflight
    from tunebench.store import Store

    started = time.perf_counter()
    overrides = {name: getattr(args, name) for name in RunConfig.model_fields}
    cfg = load_config(args.config, **overrides)
    plan = preflight(cfg)  # all input checks happen before any model is built
    store = None if args.no_store else Store(args.store)
    rec = _with_progress(plan, started)
    if store:
        store.save(rec)
        store.close()
    if args.json:
        print(rec.model_dump_json(indent=2))
    else:
        print_table(run_table(rec), Console())
        if store:
            Console(stderr=True).print(f"stored {rec.id} in {store.path}")
    return 0 if rec.status == "ok" else 1


def cmd_quick(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunebench.quick import quick_configs
    from tunebench.report.summary import compare_table, print_table
    from tunebench.runner import preflight
    from tunebench.store import Store

    configs = quick_configs(args.device)
    plans = [preflight(c) for c in configs]  # refuse bad input before the first run starts
    records = []
    with Store(args.store) as store:
        for i, plan in enumerate(plans, 1):
            Console(stderr=True).print(f"[{i}/{len(plans)}] {plan.cfg.model} {plan.cfg.method} "
                                       f"batch {plan.cfg.batch_size} seq {plan.cfg.seq_len} on {plan.device}")
            rec = _with_progress(plan, time.perf_counter())
            store.save(rec)  # stored as it finishes, not at the end
            records.append(rec)
        print_table(compare_table(records, f"tunebench quick ({plans[0].device})"), Console())
        Console(stderr=True).print(f"stored {len(records)} results in {store.path}; "
                                   "see them with: tunebench results list")
    return 0 if all(r.status == "ok" for r in records) else 1


def _with_progress(plan: Any, started: float):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tunebench.runner import execute

    cfg = plan.cfg
    console = Console(stderr=True)
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[loss]}"))
    with Progress(*cols, console=console, transient=True) as prog:
        task = prog.add_task(f"{cfg.model} {cfg.method}: building", total=cfg.steps, loss="")

        def on_step(i: int, loss: float | None) -> None:
            phase = "warmup" if i < cfg.warmup else "timed"
            prog.update(task, completed=i + 1, description=f"{cfg.model} {cfg.method}: {phase}",
                        loss="" if loss is None else f"loss {loss:.4f}")

        return execute(plan, on_step, started)


def cmd_results(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunebench.record import flat_row, json_schema
    from tunebench.report.summary import list_table, print_table
    from tunebench.store import Store

    if args.action == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    with Store(args.store) as store:
        if args.action == "list":
            print_table(list_table(list(store.records(args.kind, args.sweep))), Console())
        elif args.action == "show":
            print(store.get(args.id).model_dump_json(indent=2))
        elif args.action == "export":
            out = open(args.output, "w", newline="") if args.output else sys.stdout
            try:
                recs = list(store.records())
                if args.format == "jsonl":
                    for r in recs:
                        out.write(r.model_dump_json() + "\n")
                else:
                    rows = [flat_row(r) for r in recs]
                    cols = list(dict.fromkeys(k for row in rows for k in row))
                    w = csv.DictWriter(out, fieldnames=cols)
                    w.writeheader()
                    w.writerows(rows)
            finally:
                if args.output:
                    out.close()
                    Console(stderr=True).print(f"wrote {len(recs)} results to {Path(args.output)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return {"run": cmd_run, "quick": cmd_quick, "results": cmd_results}[args.command](args)
    except UserError as err:
        print(f"tunebench: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tunebench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
