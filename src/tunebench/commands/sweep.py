"""`tunebench sweep` and `tunebench consistency`: parse, call the API, print."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tunebench.errors import UserError
from tunebench.flags import config_from


def cmd_sweep(args: argparse.Namespace) -> int:
    from tunebench import api
    from tunebench.console import print_table, say
    from tunebench.console.progress import sweep_progress
    from tunebench.report.views import attempt_summary, sweep_plan_table, sweep_table
    from tunebench.store import default_store_path
    from tunebench.suites import parse_sets

    store = Path(args.store or default_store_path())
    if args.definition:
        return _task(args)
    if args.resume:
        plan = api.resume_plan(store, args.resume, args.repeats)
    elif not args.suite:
        raise UserError("give a suite (a YAML file or a built-in name) or --resume SWEEP_ID")
    else:
        plan = api.plan_sweep(args.suite, parse_sets(args.set), args.repeats)
    if args.dry_run:
        refused = api.refusals(plan)  # checked as the real sweep checks them
        print_table(sweep_plan_table(plan.name, plan.entries, plan.repeats, refused), args.stdout)
        if args.json:
            print(json.dumps([{"name": e.name, "config": e.config.model_dump(), "refused": refused.get(e.name)}
                              for e in plan.entries], indent=2), file=args.stdout)
        if refused:
            raise UserError(f"{len(refused)} of {len(plan.entries)} configurations would be refused on this machine; "
                            f"first: '{next(iter(refused))}': {next(iter(refused.values()))}")
        return 0
    api.check_sweep(plan)
    if not args.resume:
        api.register(store, plan)
    try:
        with api.sweep_lock(store, plan.id):  # a second runner of the same sweep is refused
            todo = api.pending(store, plan)
            say(f"sweep {plan.id}: {len(todo)} runs to do ({len(plan.entries)} configurations x {plan.repeats}), "
                f"results in {store}")
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


def _task(args: argparse.Namespace) -> int:
    """One task of a deployed sweep (the command every pod or array task runs)."""
    from tunebench import api
    from tunebench.console import say
    from tunebench.store import default_store_path

    try:
        definition = json.loads(Path(args.definition).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"invalid definition={args.definition}: not a sweep definition ({err})") from None
    index = api.task_index(args.index)
    store = str(args.store or default_store_path()).replace("{index}", str(index))
    rec = api.run_task(definition, index, args.group, store, args.run_timeout)
    say(f"task {index} of sweep {definition['sweep_id']}: {rec.status}")
    if args.print_result:
        from tunebench.deploy.command import marked

        print(marked(rec.model_dump_json()), file=args.stdout, flush=True)
    return 0 if rec.status == "ok" else 1


def cmd_consistency(args: argparse.Namespace) -> int:
    from tunebench.api import consistency
    from tunebench.console import print_table, say, warn_skipped
    from tunebench.report.consistency import table
    from tunebench.store import default_store_path

    store = Path(args.store or default_store_path())
    if args.sweep or args.with_tag:
        result, skipped = consistency.stored(store, args.sweep, args.with_tag)
        warn_skipped(skipped, store)
    else:
        result = consistency.measured(config_from(args), store,
                                      on_start=lambda i, n: say(f"GPU {i} of {n} ..."),
                                      on_done=lambda i, n, rec: say(f"GPU {i} of {n}: {rec.status}"))
    print_table(table(result), args.stdout)
    return 0 if result.ok else 1
