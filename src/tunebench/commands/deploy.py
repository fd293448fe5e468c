"""`tunebench deploy` and `tunebench collect`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebench.errors import UserError


def cmd_deploy(args: argparse.Namespace) -> int:
    from tunebench import deploy

    if args.sweep or args.resume:
        text = _sweep_text(args)
    elif args.target == "k8s":
        text = deploy.k8s_text(_k8s_job(args, args.user_args))
    else:
        text = deploy.slurm_text(args.user_args, args.nodes, args.gpus_per_node, args.job_name, args.partition,
                                 args.time, args.store)
    if args.output:
        from tunebench.files import write_text

        write_text(args.output, text)
    else:
        print(text, end="", file=args.stdout)
    return 0


def _k8s_job(args: argparse.Namespace, user_args: list[str]):
    from tunebench.deploy.k8s import K8sJob

    return K8sJob(args.name, args.nodes, args.gpus_per_node, args.image, user_args, kind=args.kind,
                  namespace=args.namespace, pvc=args.pvc, fabric=args.fabric, host_network=args.host_network,
                  node_selector=dict(_pair(x, "node-selector") for x in args.node_selector),
                  tolerations=[_toleration(t) for t in args.toleration],
                  image_pull_secrets=args.image_pull_secret, shm_size=args.shm_size, max_restarts=args.max_restarts)


def _sweep_text(args: argparse.Namespace) -> str:
    from tunebench import deploy
    from tunebench.console import say
    from tunebench.store import default_store_path
    from tunebench.suites import parse_sets

    if args.user_args:
        raise UserError("a deployed sweep takes its configurations from the suite: leave out the arguments after --")
    store = args.sweep_store or default_store_path()
    job = _k8s_job(args, ["sweep"]) if args.target == "k8s" else None
    tasks = deploy.sweep_tasks(args.sweep, parse_sets(args.set), args.repeats, store, args.resume,
                               args.gpus_per_node)
    text = deploy.k8s_sweep_text(job, tasks, args.parallelism) if job else deploy.slurm_sweep_text(
        tasks, args.job_name, args.partition, args.time, args.store, args.parallelism)
    say(f"sweep {tasks.sweep_id}: {len(tasks.tasks)} tasks ({len(tasks.entries)} configurations x {tasks.repeats}), "
        f"registered in {store}; collect their results into it, then: tunebench sweep --resume {tasks.sweep_id}")
    return text


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
    from tunebench.api import import_records
    from tunebench.console import say
    from tunebench.deploy.collect import Collected, marked_records
    from tunebench.store import default_store_path, read_exported

    got = Collected()
    for name in args.files:
        if name == "-":
            one = marked_records(sys.stdin, "stdin")
        elif not Path(name).exists():
            raise UserError(f"log file {name} does not exist")
        elif not Path(name).is_file():
            raise UserError(f"log file {name} is not a regular file (a folder, a FIFO or a device); give the log "
                            "file itself, or - for stdin")
        elif Path(name).suffix in (".jsonl", ".json"):  # an export (`results export --format jsonl`) comes back in
            one = Collected()
            one.records = read_exported(Path(name), one.skipped)
        else:
            with open(name, errors="replace") as f:
                one = marked_records(f, name)
        got.records += one.records
        got.skipped += one.skipped
    store = Path(args.store or default_store_path())
    found, new = import_records(got.records, store)
    line = f"{found} records found, {new} new, {found - new} already in {store}"
    if got.skipped:
        line += f"; {len(got.skipped)} block(s) skipped, not records"
    print(line, file=args.stdout)
    for why in got.skipped:
        say(f"  skipped {why}")
    return 0
