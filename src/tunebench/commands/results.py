"""`tunebench results`, `report`, `cost` and `compare`: reading the store."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tunebench.errors import UserError


def _read(store: str | None, kind: str | None = None, sweep: str | None = None):
    """The stored records (an existing store only), with a warning for rows this version cannot read."""
    from tunebench.console import warn_skipped
    from tunebench.store import Store

    with Store(store, create=False) as s:
        recs = list(s.records(kind, sweep))
        names = None
        if sweep:
            from tunebench.suites import names_by_hash

            definition = {i: d for i, _, _, d in s.sweeps()}.get(sweep)  # a damaged one: named in skipped
            names = names_by_hash(definition) if definition else None
    warn_skipped(s.skipped, s.path)
    return recs, names or {}


def _records_of(source: str, skipped: list[str]):
    """Records from another store (.db) or an exported JSON-lines file, and the sweeps registered there."""
    from tunebench.store import Store, read_exported

    p = Path(source)
    if not p.is_file():
        raise UserError(f"store {source} does not exist")
    if p.suffix in (".jsonl", ".json"):
        return read_exported(p, skipped), []
    with Store(p, create=False) as other:
        recs, sweeps = list(other.records()), other.sweeps()
    skipped += other.skipped
    return recs, sweeps


def cmd_results(args: argparse.Namespace) -> int:
    from tunebench.console import print_table, say, warn_skipped
    from tunebench.record import json_schema
    from tunebench.report.export import check_destination, export, write_csv, write_jsonl
    from tunebench.report.views import list_table
    from tunebench.store import Store

    if args.action == "merge":
        from tunebench.api import import_records

        for src in args.stores:
            skipped: list[str] = []
            recs, sweeps = _records_of(src, skipped)
            found, new = import_records(recs, args.store, sweeps)
            warn_skipped(skipped, src)
            print(f"{src}: {found} records, {new} new", file=args.stdout)
        return 0
    if args.action == "schema":
        print(json.dumps(json_schema(), indent=2), file=args.stdout)
        return 0
    if args.action == "show":
        with Store(args.store, create=False) as store:
            print(store.get(args.id).model_dump_json(indent=2), file=args.stdout)
        return 0
    if args.action == "export" and args.output == "":
        raise UserError("invalid output='': an empty path; give a file, or leave -o out to write to stdout")
    if args.action == "export" and args.output:
        check_destination(Path(args.output))  # before reading: a wrong path fails at once
    recs, _ = _read(args.store, getattr(args, "kind", None), getattr(args, "sweep", None))
    if args.action == "list":
        print_table(list_table(recs), args.stdout)
    elif args.output:
        export(recs, Path(args.output), args.format)
        say(f"wrote {len(recs)} results to {Path(args.output)}")
    else:
        (write_jsonl if args.format == "jsonl" else write_csv)(recs, args.stdout)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from tunebench.console import say
    from tunebench.report.build import prepare_out, write_report
    from tunebench.report.cost import load_prices

    prices = load_prices(args.prices)
    if args.job_samples < 1:
        raise UserError(f"invalid job_samples={args.job_samples}: must be positive")
    out = Path(args.out)
    prepare_out(out, args.force)  # before reading anything
    records, names = _read(args.store, sweep=args.sweep)
    if not records:
        raise UserError("no results to report" + (f" for sweep {args.sweep}" if args.sweep else ""))
    from tunebench.api.plan import with_predictions

    with_predictions(records, args.store)
    title = args.title or (f"tunebench report: sweep {args.sweep}" if args.sweep else "tunebench report")
    title = " ".join("".join(c if c.isprintable() else " " for c in title).split())  # one line, as a heading is
    files = write_report(records, out, prices, title, names, args.job_samples, args.publish, args.force)
    say(f"wrote {len(files)} files to {out}/ ({len(records)} results): "
        + ", ".join(p.relative_to(out).as_posix() for p in files))
    print(out / "report.html", file=args.stdout)
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from tunebench.console import print_table
    from tunebench.report.cost import cost_of, load_prices, offerings_for
    from tunebench.report.views import cost_table
    from tunebench.store import Store

    with Store(args.store, create=False) as store:
        rec = store.get(args.id)
    if rec.kind != "train":
        raise UserError(f"result {rec.id[:12]} is a {rec.kind} result; cost applies to training results")
    if rec.status != "ok" or not rec.metrics.tokens_per_s:
        raise UserError(f"result {rec.id[:12]} has status {rec.status} and no throughput to cost")
    gpu = rec.environment.get("gpu", {}).get("name")
    if not gpu:
        raise UserError(f"result {rec.id[:12]} ran on the CPU: CPU runs have no GPU price (no offering in any price "
                        "sheet), so it has no cost; cost applies to GPU runs")
    offers = offerings_for(gpu, load_prices(args.prices))
    if not offers:
        raise UserError(f"no offering in the price sheet matches {gpu}; pass --prices FILE with one for it")
    costs = [c for o in offers for spot in (False, True) if (c := cost_of(rec, o, spot, args.samples))]
    print_table(cost_table(rec, costs, args.samples), args.stdout)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from tunebench.console import print_table, warn_skipped
    from tunebench.report.compare import compare, load_side
    from tunebench.report.views import comparison_table

    skipped_a: list[str] = []
    skipped_b: list[str] = []
    rows, only = compare(load_side(args.a, args.store, skipped_a), load_side(args.b, args.store, skipped_b),
                         args.threshold)
    warn_skipped(skipped_a, args.a)
    warn_skipped(skipped_b, args.b)
    if not rows:
        raise UserError("the two sides have no configuration in common")
    print_table(comparison_table(rows, args.a, args.b, args.threshold), args.stdout)
    print("; ".join(only), file=args.stdout)
    return 1 if any(r.regression for r in rows) else 0
