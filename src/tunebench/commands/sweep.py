"""`tunebench sweep` and `tunebench consistency`: parse, call the API, print."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tunebench.config import RunConfig
from tunebench.errors import UserError


def cmd_sweep(args: argparse.Namespace) -> int:
    from tunebench import api
    from tunebench.console import print_table, say
    from tunebench.console.progress import sweep_progress
    from tunebench.report.views import attempt_summary, sweep_plan_table, sweep_table
    from tunebench.store import default_store_path
    from tunebench.suites import parse_sets

    store = Path(args.store or default_store_path())
    if args.resume:
        plan = api.resume_plan(store, args.resume, args.repeats)
    elif not args.suite:
        raise UserError("give a suite (a YAML file or a built-in name) or --resume SWEEP_ID")
    else:
        plan = api.plan_sweep(args.suite, parse_sets(args.set), args.repeats)
    if args.dry_run:
        print_table(sweep_plan_table(plan.name, plan.entries, plan.repeats), args.stdout)
        if args.json:
            print(json.dumps([{"name": e.name, "config": e.config.model_dump()} for e in plan.entries], indent=2),
                  file=args.stdout)
        return 0
    api.check_sweep(plan)
    if not args.resume:
        api.register(store, plan)
    todo = api.pending(store, plan)
    say(f"sweep {plan.id}: {len(todo)} runs to do ({len(plan.entries)} configurations x {plan.repeats}), "
        f"results in {store}")
    try:
        with sweep_progress(len(todo), lambda a: a.entry.name, attempt_summary) as (on_start, on_done):
            api.run_sweep(plan, store, todo, args.run_timeout, on_start, on_done)
    except KeyboardInterrupt:
        say(f"interrupted: finished runs are stored; continue with: tunebench sweep --resume {plan.id}")
        return 130
    records, complete = api.sweep_records(store, plan)
    if args.json:
        print(json.dumps([json.loads(r.model_dump_json()) for r in records], indent=2), file=args.stdout)
    else:
        print_table(sweep_table(f"sweep {plan.id} ({plan.name})", plan.entries, records), args.stdout)
    return 0 if complete else 1


def cmd_consistency(args: argparse.Namespace) -> int:
    import collections

    import torch

    from tunebench import api
    from tunebench.config import load_config
    from tunebench.console import print_table, say
    from tunebench.report import consistency as cons
    from tunebench.store import Store, default_store_path

    store = Path(args.store or default_store_path())
    if args.sweep or args.with_tag:
        with Store(store) as s:
            recs = [r for r in s.records("train", args.sweep) if r.status == "ok" and r.metrics.tokens_per_s
                    and (not args.with_tag or args.with_tag in r.tags)]
        groups = collections.Counter(r.config_hash for r in recs)
        if not groups:
            raise UserError("no ok results match: nothing to compare")
        main_hash = groups.most_common(1)[0][0]  # the configuration run most often
        recs = [r for r in recs if r.config_hash == main_hash]
    else:
        overrides = {name: getattr(args, name) for name in RunConfig.model_fields}
        cfg = load_config(args.config, **overrides).model_copy(update={"device": "cuda"})
        gpus = torch.cuda.device_count()
        if gpus == 0:
            raise UserError("no GPU is visible: compare stored runs from several nodes with --sweep or --with-tag")
        recs = api.run_each_gpu(cfg, gpus, store, args.run_timeout,
                                on_done=lambda i, rec: say(f"GPU {i} of {gpus}: {rec.status}"))
        recs = [r for r in recs if r.status == "ok" and r.metrics.tokens_per_s]
    if len(recs) < 2:
        raise UserError(f"consistency needs at least 2 ok runs of one configuration, found {len(recs)}")
    result = cons.analyse(recs)
    print_table(cons.table(result), args.stdout)
    return 0 if result.ok else 1
