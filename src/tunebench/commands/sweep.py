"""`tunebench sweep` and `tunebench consistency`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tunebench.config import RunConfig
from tunebench.errors import UserError


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tunebench.launch import sweep as sw
    from tunebench.report.summary import print_table, sweep_table
    from tunebench.runner import preflight
    from tunebench.store import Store, default_store_path
    from tunebench.suites import expand, load_suite, parse_sets

    store_path = Path(args.store or default_store_path())
    if args.resume:
        with Store(store_path) as store:
            name, entries, repeats = sw.registered_entries(store, args.resume)
        sweep_id, repeats = args.resume, args.repeats or repeats
    else:
        if not args.suite:
            raise UserError("give a suite (a YAML file or a built-in name) or --resume SWEEP_ID")
        suite = load_suite(args.suite)
        entries = expand(suite, parse_sets(args.set))
        name, repeats = str(suite.get("name") or Path(args.suite).stem), args.repeats or 1
        sweep_id = sw.new_sweep_id(name)
    if repeats < 1:
        raise UserError(f"invalid repeats={repeats}: must be at least 1")
    if args.dry_run:
        t = Table(title=f"suite {name}: {len(entries)} configurations x {repeats} repeats")
        for col in ("#", "name", "model", "method", "strategy", "batch x accum x seq", "precision", "optimizer",
                    "hash"):
            t.add_column(col)
        for i, e in enumerate(entries, 1):
            c = e.config
            t.add_row(str(i), e.name, c.model, c.method, c.strategy, f"{c.batch_size} x {c.grad_accum} x {c.seq_len}",
                      c.precision, c.optimizer, c.config_hash())
        print_table(t, Console(file=args.stdout))
        if args.json:
            print(json.dumps([{"name": e.name, "config": e.config.model_dump()} for e in entries], indent=2),
                  file=args.stdout)
        return 0
    for e in entries:  # every configuration is checked before the first one runs
        try:
            preflight(e.config)
        except UserError as err:
            raise UserError(f"suite entry '{e.name}': {err}") from None
    with Store(store_path) as store:
        if not args.resume:
            sw.register(store, sweep_id, name, entries, repeats)
        todo = sw.pending(store, sweep_id, entries, repeats)
    console = Console(stderr=True)
    console.print(f"sweep {sweep_id}: {len(todo)} runs to do ({len(entries)} configurations x {repeats}), "
                  f"results in {store_path}")
    try:
        _sweep_with_progress(todo, store_path, sweep_id, args.run_timeout, console)
    except KeyboardInterrupt:
        console.print(f"interrupted: finished runs are stored; continue with: tunebench sweep --resume {sweep_id}")
        return 130
    with Store(store_path) as store:
        records = list(store.records(sweep_id=sweep_id))
        complete = sw.pending(store, sweep_id, entries, repeats) == []
    if args.json:
        print(json.dumps([json.loads(r.model_dump_json()) for r in records], indent=2), file=args.stdout)
    else:
        print_table(sweep_table(f"sweep {sweep_id} ({name})", entries, records), Console(file=args.stdout))
    return 0 if complete else 1


def _sweep_with_progress(todo: list, store_path: Path, sweep_id: str, timeout: float, console) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from tunebench.launch.sweep import run_sweep

    def summary(rec) -> str:
        tps = rec.metrics.tokens_per_s
        return f"{rec.status}" + (f", {tps:,.0f} tokens/s" if tps else "")

    if not console.is_terminal:
        def start(i, a):
            console.print(f"[{i + 1}/{len(todo)}] {a.entry.name} ...")

        def done(i, a, rec):
            console.print(f"[{i + 1}/{len(todo)}] {a.entry.name}: {summary(rec)}")

        run_sweep(todo, store_path, sweep_id, timeout, on_done=done, on_start=start)
        return
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
            TimeRemainingColumn(), TextColumn("{task.fields[last]}"))
    with Progress(*cols, console=console) as prog:
        task = prog.add_task("sweep", total=len(todo), last="")
        run_sweep(todo, store_path, sweep_id, timeout,
                  on_start=lambda i, a: prog.update(task, description=f"[{i + 1}/{len(todo)}] {a.entry.name}"),
                  on_done=lambda i, a, rec: prog.update(task, advance=1, last=f"last: {summary(rec)}"))


def cmd_consistency(args: argparse.Namespace) -> int:
    import collections

    import torch
    from rich.console import Console

    from tunebench.config import load_config
    from tunebench.launch import sweep as sw
    from tunebench.report import consistency as cons
    from tunebench.report.summary import print_table
    from tunebench.runner import preflight
    from tunebench.store import Store, default_store_path

    store_path = Path(args.store or default_store_path())
    if args.sweep or args.with_tag:
        with Store(store_path) as store:
            recs = [r for r in store.records("train", args.sweep) if r.status == "ok" and r.metrics.tokens_per_s
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
        preflight(cfg)
        sweep_id = sw.new_sweep_id("consistency")
        recs = []
        for i in range(gpus):
            Console(stderr=True).print(f"GPU {i} of {gpus} ...")
            rec = sw.run_isolated(cfg, store_path, sweep_id, args.run_timeout, env={"CUDA_VISIBLE_DEVICES": str(i)})
            Console(stderr=True).print(f"GPU {i}: {rec.status}")
            recs.append(rec)
        recs = [r for r in recs if r.status == "ok" and r.metrics.tokens_per_s]
    if len(recs) < 2:
        raise UserError(f"consistency needs at least 2 ok runs of one configuration, found {len(recs)}")
    result = cons.analyse(recs)
    print_table(cons.table(result), Console(file=args.stdout))
    return 0 if result.ok else 1
