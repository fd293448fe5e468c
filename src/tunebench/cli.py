"""The command line: a thin layer over the Python API (tunebench.run, tunebench.Store)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import time
from pathlib import Path
from typing import NoReturn, Sequence, get_origin

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
    run.add_argument("--gpus", help="scaling: run the same per-GPU config at each of these world sizes "
                                    "(e.g. 1,2,4; processes on CPU) and report speedup and efficiency")
    run.add_argument("--json", action="store_true", help="print the record as JSON on stdout")
    run.add_argument("--no-store", action="store_true", help="do not write the record to the store")
    run.add_argument("--print-result", action="store_true", help="also print the record between markers "
                                                                 "(for logs: tunebench collect reads them)")
    run.add_argument("--sweep-id", help=argparse.SUPPRESS)  # set by `tunebench sweep` for its child runs
    run.add_argument("--record-id", help=argparse.SUPPRESS)
    _store_arg(run)

    sw = sub.add_parser("sweep", help="run a suite of configurations, each in its own process, resumably")
    sw.add_argument("suite", nargs="?", help="suite YAML file or built-in name (quick, full, diagnostic, scaling, "
                                             "seed-qlora)")
    sw.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key in every run")
    sw.add_argument("--dry-run", action="store_true", help="print the expanded configurations and their count")
    sw.add_argument("--repeats", type=int, default=None, help="runs per configuration (default 1); the summary "
                                                              "gives mean, std and CV")
    sw.add_argument("--resume", metavar="SWEEP_ID", help="run only what this sweep has no ok result for")
    sw.add_argument("--run-timeout", type=float, default=3600.0, help="seconds one configuration may take "
                                                                      "(default 3600); then status timeout")
    sw.add_argument("--json", action="store_true", help="print the sweep's records as JSON")
    _store_arg(sw)

    con = sub.add_parser("consistency", help="the same config on each local GPU in turn (or stored runs from "
                                             "several nodes): spread against ±5%% throughput, ±2%% memory")
    con.add_argument("config", nargs="?", help="YAML run config; flags override its keys")
    _add_config_flags(con)
    con.add_argument("--sweep", help="compare the stored ok runs of this sweep instead of running")
    con.add_argument("--with-tag", dest="with_tag", help="compare the stored ok runs with this tag instead of running")
    con.add_argument("--run-timeout", type=float, default=3600.0)
    _store_arg(con)

    dep = sub.add_parser("deploy", help="Kubernetes manifests or a Slurm script running tunebench: "
                                        "tunebench deploy k8s|slurm [options] -- run <args>")
    dsub = dep.add_subparsers(dest="target", required=True, parser_class=_Parser)
    k8s = dsub.add_parser("k8s", help="JobSet (default), Indexed Job + headless Service, or Kubeflow TrainJob")
    k8s.add_argument("--name", required=True)
    k8s.add_argument("--image", required=True)
    k8s.add_argument("--kind", choices=("jobset", "indexed-job", "trainjob"), default="jobset")
    k8s.add_argument("--namespace")
    k8s.add_argument("--pvc", help="PersistentVolumeClaim holding the results store (mounted at /results)")
    k8s.add_argument("--fabric", choices=("ethernet", "infiniband"), default="ethernet")
    k8s.add_argument("--host-network", action="store_true")
    k8s.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    k8s.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE]:EFFECT")
    k8s.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME")
    k8s.add_argument("--shm-size", default="16Gi")
    k8s.add_argument("--max-restarts", type=int, default=0, help="JobSet failurePolicy restarts")
    slurm = dsub.add_parser("slurm", help="an sbatch script with srun + tunebench (torchrun inside)")
    slurm.add_argument("--job-name", default="tunebench")
    slurm.add_argument("--partition")
    slurm.add_argument("--time")
    slurm.add_argument("--store", help="results store path on the cluster's shared file system")
    for p in (k8s, slurm):
        p.add_argument("--nodes", type=int, default=1)
        p.add_argument("--gpus-per-node", type=int, default=1)
        p.add_argument("-o", "--output", help="write here instead of stdout")

    col = sub.add_parser("collect", help="read marked result records from logs (files or -) into the store")
    col.add_argument("files", nargs="+", help="log files, or - for standard input")
    _store_arg(col)

    rep = sub.add_parser("report", help="report.md, report.html, plots, CSV and Parquet from the results store")
    pick = rep.add_mutually_exclusive_group()
    pick.add_argument("--sweep", help="one sweep's results")
    pick.add_argument("--all", action="store_true", help="every result in the store (the default)")
    rep.add_argument("--out", default="tunebench-report", help="output folder (default ./tunebench-report)")
    rep.add_argument("--prices", help="price sheet YAML replacing the shipped one")
    rep.add_argument("--job-samples", type=int, default=10_000, help="job size for time and cost (default 10,000)")
    rep.add_argument("--title", help="report title")
    rep.add_argument("--publish", action="store_true", help="also one Markdown file per configuration (publish/)")
    _store_arg(rep)

    cost = sub.add_parser("cost", help="cost of one stored result for a job of N samples")
    cost.add_argument("id", help="result id or unique prefix")
    cost.add_argument("--samples", type=int, default=10_000)
    cost.add_argument("--prices", help="price sheet YAML replacing the shipped one")
    _store_arg(cost)

    cmp_ = sub.add_parser("compare", help="compare two sweeps, stores (.db) or exported files (.jsonl)")
    cmp_.add_argument("a", help="the reference")
    cmp_.add_argument("b", help="the candidate")
    cmp_.add_argument("--threshold", type=float, default=0.05, help="flag changes beyond this fraction (0.05)")
    _store_arg(cmp_)

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
    merge = rsub.add_parser("merge", help="merge stores written by separate nodes into --store (duplicates skipped)")
    merge.add_argument("stores", nargs="+")
    for p in (ls, show, exp, merge):
        _store_arg(p)
    return parser


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
    if args.json:
        print(json.dumps([json.loads(r.model_dump_json()) for r in records], indent=2), file=args.stdout)
    else:
        print_table(sweep_table(f"sweep {sweep_id} ({name})", entries, records), Console(file=args.stdout))
    complete = sw.pending(Store(store_path), sweep_id, entries, repeats) == []
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
            recs = [r for r in store.records(sweep_id=args.sweep) if r.status == "ok" and r.metrics.tokens_per_s
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


def cmd_deploy(args: argparse.Namespace) -> int:
    if args.target == "k8s":
        from tunebench.deploy.k8s import K8sJob, manifests, to_yaml

        job = K8sJob(args.name, args.nodes, args.gpus_per_node, args.image, args.user_args, kind=args.kind,
                     namespace=args.namespace, pvc=args.pvc, fabric=args.fabric, host_network=args.host_network,
                     node_selector=dict(_pair(x, "node-selector") for x in args.node_selector),
                     tolerations=[_toleration(t) for t in args.toleration],
                     image_pull_secrets=args.image_pull_secret, shm_size=args.shm_size, max_restarts=args.max_restarts)
        text = to_yaml(manifests(job))
    else:
        from tunebench.deploy.slurm import sbatch_script

        text = sbatch_script(args.user_args, args.nodes, args.gpus_per_node, args.job_name, args.partition,
                             args.time, args.store)
    if args.output:
        Path(args.output).write_text(text)
    else:
        print(text, end="", file=args.stdout)
    return 0


def _pair(text: str, what: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UserError(f"invalid {what}={text}: expected KEY=VALUE")
    return key, value


def _toleration(text: str) -> dict:
    kv, sep, effect = text.rpartition(":")
    if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise UserError(f"invalid toleration={text}: expected KEY[=VALUE]:NoSchedule|PreferNoSchedule|NoExecute")
    key, eq, value = kv.partition("=")
    return {"key": key, "operator": "Equal", "value": value, "effect": effect} if eq else \
        {"key": key, "operator": "Exists", "effect": effect}


def cmd_collect(args: argparse.Namespace) -> int:
    from tunebench.deploy.collect import marked_records
    from tunebench.store import Store

    found = new = 0
    with Store(args.store) as store:
        for name in args.files:
            if name == "-":
                recs = marked_records(sys.stdin)
            else:
                if not Path(name).is_file():
                    raise UserError(f"log file {name} does not exist")
                with open(name, errors="replace") as f:
                    recs = marked_records(f)
            found += len(recs)
            new += sum(store.save(r) for r in recs)
        print(f"{found} records found, {new} new, {found - new} already in {store.path}", file=args.stdout)
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


def cmd_quick(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tunebench.quick import quick_configs
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
    Console(stderr=True).print(f"stored {len(records)} results in {store_path}; see them with: tunebench results list")
    return 0 if all(r.status == "ok" for r in records) else 1


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    user_args: list[str] = []
    if argv[:1] == ["deploy"] and "--" in argv:  # everything after -- is tunebench's own arguments, verbatim
        cut = argv.index("--")
        argv, user_args = argv[:cut], argv[cut + 1:]
    try:
        args = build_parser().parse_args(argv)
        args.user_args = user_args
        args.stdout = sys.stdout  # results go here; anything libraries print (DeepSpeed logs) goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            commands = {"run": cmd_run, "sweep": cmd_sweep, "consistency": cmd_consistency, "quick": cmd_quick,
                        "report": cmd_report, "cost": cmd_cost, "compare": cmd_compare, "results": cmd_results,
                        "deploy": cmd_deploy, "collect": cmd_collect}
            return commands[args.command](args)
    except UserError as err:
        print(f"tunebench: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tunebench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
