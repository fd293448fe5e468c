"""`tunebench run` (one configuration, or a scaling series) and `tunebench quick`: parse, call the API, print."""

from __future__ import annotations

import argparse
import json

from tunebench.errors import UserError
from tunebench.flags import config_from

MAX_WORLD = 1 << 16  # GPUs in one job: far beyond any cluster's, small enough for every table and plan


def world_sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UserError(f"invalid gpus={text}: expected a comma-separated list of world sizes like 1,2,4") from None
    if not sizes or sizes[0] < 1:
        raise UserError(f"invalid gpus={text}: world sizes must be positive integers")
    if sizes[-1] > MAX_WORLD:
        raise UserError(f"invalid gpus={text}: {sizes[-1]:,} GPUs is beyond any job tunebench launches (at most "
                        f"{MAX_WORLD:,})")
    return sizes


def store_of(args: argparse.Namespace):
    from tunebench.store import default_store_path

    return None if getattr(args, "no_store", False) else (args.store or default_store_path())


def print_record(rec, args: argparse.Namespace) -> None:
    """A finished run or job on stdout: JSON or its table, then (--print-result) the marked line `collect` reads."""
    from tunebench.console import print_table
    from tunebench.report.views import run_table

    if args.json:
        print(rec.model_dump_json(indent=2), file=args.stdout)
    else:
        print_table(run_table(rec), args.stdout)
    if args.print_result:
        from tunebench.deploy.command import marked

        print(marked(rec.model_dump_json()), file=args.stdout, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config_from(args)  # bad input is refused here, before torch is even imported
    sizes, store = world_sizes(args.gpus), store_of(args)
    from tunebench import api
    from tunebench.console import print_table, say
    from tunebench.report.views import scaling_table

    if sizes:
        records = api.run_scaling(cfg, sizes, store, progress=True)
        if args.json:
            print(json.dumps([json.loads(r.model_dump_json()) for r in records], indent=2), file=args.stdout)
        else:
            print_table(scaling_table(records), args.stdout)
        return 0 if len(records) == len(sizes) and all(r.status == "ok" for r in records) else 1
    rec = api.run(cfg, store, progress=True)
    if rec is None:
        say("rank 0 ran on another node: its record is in that node's store")
        return 0
    print_record(rec, args)
    if args.print_result and rec.saved_to:
        say(f"stored {rec.id} in {rec.saved_to}")
    return 0 if rec.status == "ok" else 1


def cmd_quick(args: argparse.Namespace) -> int:
    from tunebench import api
    from tunebench.console import print_table, say
    from tunebench.report.views import compare_table, describe

    store = store_of(args)
    records, _ = api.quick(args.device, store, args.out,
                           on_start=lambda i, n, c: say(f"{i + 1}/{n}: {describe(c)}"))
    print_table(compare_table(records, "tunebench quick"), args.stdout)
    say(f"stored {len(records)} results in {store}; report in {args.out}/report.html (and report.md)")
    return 0 if all(r.status == "ok" for r in records) else 1
