"""`tunebench results`, `report`, `cost` and `compare`: reading the store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tunebench.errors import UserError


def cmd_results(args: argparse.Namespace) -> int:
    from tunebench.console import print_table, say
    from tunebench.record import json_schema
    from tunebench.report.export import export, write_csv, write_jsonl
    from tunebench.report.views import list_table
    from tunebench.store import Store

    if args.action == "merge":
        from tunebench.api import import_records

        for src in args.stores:
            if not Path(src).is_file():
                raise UserError(f"store {src} does not exist")
            with Store(src) as other:
                recs = list(other.records())
            found, new = import_records(recs, args.store)
            print(f"{src}: {found} records, {new} new", file=args.stdout)
        return 0
    if args.action == "schema":
        print(json.dumps(json_schema(), indent=2), file=args.stdout)
        return 0
    with Store(args.store) as store:
        if args.action == "list":
            print_table(list_table(list(store.records(args.kind, args.sweep))), args.stdout)
        elif args.action == "show":
            print(store.get(args.id).model_dump_json(indent=2), file=args.stdout)
        elif args.action == "export":
            recs = list(store.records())
            if args.output:
                export(recs, Path(args.output), args.format)
                say(f"wrote {len(recs)} results to {Path(args.output)}")
            else:
                (write_jsonl if args.format == "jsonl" else write_csv)(recs, args.stdout)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from tunebench.console import say
    from tunebench.report.build import write_report
    from tunebench.report.cost import load_prices
    from tunebench.report.publish import publish
    from tunebench.store import Store
    from tunebench.suites import names_by_hash

    prices = load_prices(args.prices)
    if args.job_samples < 1:
        raise UserError(f"invalid job_samples={args.job_samples}: must be positive")
    with Store(args.store) as store:
        records = list(store.records(sweep_id=args.sweep))
        names = names_by_hash(store.sweep(args.sweep)) if args.sweep else {}
    if not records:
        raise UserError("no results to report" + (f" for sweep {args.sweep}" if args.sweep else ""))
    out = Path(args.out)
    title = args.title or (f"tunebench report: sweep {args.sweep}" if args.sweep else "tunebench report")
    files = write_report(records, out, prices, title, names, args.job_samples)
    if args.publish:
        (out / "publish").mkdir(exist_ok=True)
        for r in records:
            if r.kind == "train":
                publish(r, out / "publish", names.get(r.config_hash))
    say(f"wrote {len(files)} files to {out}/ ({len(records)} results): "
        + ", ".join(p.name for p in files if p.is_file()))
    print(out / "report.html", file=args.stdout)
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from tunebench.console import print_table
    from tunebench.report.cost import cost_of, load_prices, offerings_for
    from tunebench.report.views import cost_table
    from tunebench.store import Store

    with Store(args.store) as store:
        rec = store.get(args.id)
    if rec.kind != "train":
        raise UserError(f"result {rec.id[:12]} is a {rec.kind} result; cost applies to training results")
    if rec.status != "ok" or not rec.metrics.tokens_per_s:
        raise UserError(f"result {rec.id[:12]} has status {rec.status} and no throughput to cost")
    gpu = rec.environment.get("gpu", {}).get("name")
    offers = offerings_for(gpu, load_prices(args.prices))
    if not offers:
        raise UserError(f"no offering in the price sheet matches {gpu or 'a CPU run'}; pass --prices FILE")
    costs = [c for o in offers for spot in (False, True) if (c := cost_of(rec, o, spot, args.samples))]
    print_table(cost_table(rec, costs, args.samples), args.stdout)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from tunebench.console import print_table
    from tunebench.report.compare import compare, load_side
    from tunebench.report.views import comparison_table

    rows, only = compare(load_side(args.a, args.store), load_side(args.b, args.store), args.threshold)
    if not rows:
        raise UserError("the two sides have no configuration in common")
    print_table(comparison_table(rows, args.a, args.b, args.threshold), args.stdout)
    print("; ".join(only), file=args.stdout)
    return 1 if any(r.regression for r in rows) else 0
