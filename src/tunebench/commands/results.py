"""`tunebench results`, `report`, `cost` and `compare`: reading the store."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from tunebench.errors import UserError


def cmd_results(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunebench.record import flat_row, json_schema
    from tunebench.report.summary import list_table, print_table
    from tunebench.store import Store

    if args.action == "merge":
        with Store(args.store) as store:
            for src in args.stores:
                if not Path(src).is_file():
                    raise UserError(f"store {src} does not exist")
                with Store(src) as other:
                    recs = list(other.records())
                new = sum(store.save(r) for r in recs)
                print(f"{src}: {len(recs)} records, {new} new", file=args.stdout)
        return 0
    if args.action == "schema":
        print(json.dumps(json_schema(), indent=2), file=args.stdout)
        return 0
    with Store(args.store) as store:
        if args.action == "list":
            print_table(list_table(list(store.records(args.kind, args.sweep))), Console(file=args.stdout))
        elif args.action == "show":
            print(store.get(args.id).model_dump_json(indent=2), file=args.stdout)
        elif args.action == "export":
            out = open(args.output, "w", newline="") if args.output else args.stdout
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


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunebench.launch.sweep import registered_entries
    from tunebench.report.build import write_report
    from tunebench.report.cost import load_prices
    from tunebench.report.publish import publish
    from tunebench.store import Store

    prices = load_prices(args.prices)
    if args.job_samples < 1:
        raise UserError(f"invalid job_samples={args.job_samples}: must be positive")
    with Store(args.store) as store:
        records = list(store.records(sweep_id=args.sweep))
        names = {}
        if args.sweep:
            _, entries, _ = registered_entries(store, args.sweep)
            names = {e.config.config_hash(): e.name for e in entries}
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
    Console(stderr=True).print(f"wrote {len(files)} files to {out}/ ({len(records)} results): "
                               + ", ".join(p.name for p in files if p.is_file()))
    print(out / "report.html", file=args.stdout)
    return 0


def cmd_cost(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tunebench.report.cost import cost_of, load_prices, offerings_for
    from tunebench.report.summary import print_table
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
    t = Table(title=f"{rec.id[:12]}: {rec.config['model']} {rec.config['method']} on {rec.metrics.world_size} x {gpu}, "
                    f"{rec.metrics.samples_per_s:,.3f} samples/s, job of {args.samples:,} samples")
    for col in ("offering", "pricing", "$/hour", "$/1K samples", "$/1M tokens", "tokens per $", "job time", "job cost",
                "source"):
        t.add_column(col)
    for o in offers:
        for spot in (False, True):
            c = cost_of(rec, o, spot, args.samples)
            if c:
                t.add_row(o.provider, "spot" if spot else "on-demand", f"${c.dollars_per_hour:.2f}",
                          f"${c.per_1k_samples:.4f}", f"${c.per_1m_tokens:.3f}", f"{c.tokens_per_dollar:,.0f}",
                          f"{c.job_hours:.2f} h", f"${c.job_cost:.2f}", f"{o.source} ({o.date})")
    print_table(t, Console(file=args.stdout))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tunebench.report.compare import compare, load_side
    from tunebench.report.summary import print_table

    rows, only = compare(load_side(args.a, args.store), load_side(args.b, args.store), args.threshold)
    if not rows:
        raise UserError("the two sides have no configuration in common")
    t = Table(title=f"B = {args.b} against A = {args.a} (threshold {args.threshold:.0%})")
    for col in ("configuration", "tokens/s B/A", "peak memory B/A", "MFU B/A", "flags"):
        t.add_column(col)
    for r in rows:
        t.add_row(r.name, *("-" if v is None else f"{v:.3f}" for v in r.ratios.values()),
                  ("REGRESSION: " if r.regression else "") + ", ".join(r.flags))
    print_table(t, Console(file=args.stdout))
    print("; ".join(only), file=args.stdout)
    return 1 if any(r.regression for r in rows) else 0
