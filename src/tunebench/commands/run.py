"""`tunebench run` (one configuration, or a scaling series) and `tunebench quick`."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tunebench.config import RunConfig
from tunebench.errors import UserError


def _sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UserError(f"invalid gpus={text}: expected a comma-separated list of world sizes like 1,2,4") from None
    if not sizes or sizes[0] < 1:
        raise UserError(f"invalid gpus={text}: world sizes must be positive integers")
    return sizes


def run_one(cfg: RunConfig, store_path: str | Path | None, sweep_id: str | None = None,
            scaling_baseline: dict | None = None, record_id: str | None = None):
    """One configuration: in this process, or under torchrun when it is distributed."""
    from tunebench.launch.torchrun import launch
    from tunebench.launch.worker import apply_scaling
    from tunebench.report.progress import run_progress
    from tunebench.runner import execute, preflight
    from tunebench.store import Store

    if cfg.distributed:
        return launch(cfg, store_path, sweep_id, scaling_baseline, record_id)
    started = time.perf_counter()
    plan = preflight(cfg)
    with run_progress(cfg) as progress:
        rec = execute(plan, progress, started, record_id=record_id)
    rec.sweep_id = sweep_id
    apply_scaling(rec, scaling_baseline)
    if store_path:
        with Store(store_path) as store:
            store.save(rec)
    return rec


def cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunebench.config import load_config
    from tunebench.report.summary import print_table, run_table, scaling_table
    from tunebench.runner import preflight
    from tunebench.store import default_store_path

    overrides = {name: getattr(args, name) for name in RunConfig.model_fields}
    cfg = load_config(args.config, **overrides)
    sizes = _sizes(args.gpus)
    store_path = None if args.no_store else (args.store or default_store_path())
    if sizes:
        configs = [cfg.model_copy(update={"nproc_per_node": n}) for n in sizes]
        for c in configs:
            preflight(c)  # every size is checked before the first one runs
        records = []
        for c in configs:  # the first size that succeeds is the baseline of the others
            base = next((r for r in records if r and r.status == "ok"), None)
            baseline = {"id": base.id, "world_size": base.metrics.world_size,
                        "tokens_per_s": base.metrics.tokens_per_s} if base else {"self": True}
            records.append(run_one(c, store_path, scaling_baseline=baseline))
        if args.json:
            print(json.dumps([json.loads(r.model_dump_json()) for r in records if r], indent=2), file=args.stdout)
        else:
            print_table(scaling_table([r for r in records if r]), Console(file=args.stdout))
        return 0 if all(r and r.status == "ok" for r in records) else 1
    if not cfg.distributed:
        preflight(cfg)  # all input checks happen before any model is built
    rec = run_one(cfg, store_path, args.sweep_id, record_id=args.record_id)
    if rec is None:
        Console(stderr=True).print("rank 0 ran on another node: its record is in that node's store")
        return 0
    if args.json:
        print(rec.model_dump_json(indent=2), file=args.stdout)
    else:
        print_table(run_table(rec), Console(file=args.stdout))
    if args.print_result:
        from tunebench.deploy.command import MARKER_BEGIN, MARKER_END

        print(f"{MARKER_BEGIN}\n{rec.model_dump_json()}\n{MARKER_END}", file=args.stdout, flush=True)
        if store_path:
            Console(stderr=True).print(f"stored {rec.id} in {store_path}")
    return 0 if rec.status == "ok" else 1


def cmd_quick(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunebench.quick import quick_configs
    from tunebench.report.build import write_report
    from tunebench.report.cost import load_prices
    from tunebench.report.summary import compare_table, print_table
    from tunebench.runner import preflight
    from tunebench.store import default_store_path

    configs = quick_configs(args.device)
    for c in configs:
        preflight(c)  # refuse bad input before the first run starts
    store_path = args.store or default_store_path()
    records = []
    for i, c in enumerate(configs, 1):
        Console(stderr=True).print(f"{i}/{len(configs)}: {c.model} {c.method} batch {c.batch_size} seq {c.seq_len}")
        records.append(run_one(c, store_path))  # each stored as it finishes, not at the end
    print_table(compare_table(records, "tunebench quick"), Console(file=args.stdout))
    out = Path(args.out)
    write_report(records, out, load_prices(), "tunebench quick")
    Console(stderr=True).print(f"stored {len(records)} results in {store_path}; report in {out}/report.html "
                               "(and report.md)")
    return 0 if all(r.status == "ok" for r in records) else 1
