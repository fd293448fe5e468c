"""`tunebench plan`: parse, call tunebench.api.plan, print the prediction (tables or JSON)."""

from __future__ import annotations

import argparse
import json

from tunebench.config import RunConfig, TrainConfig, read_yaml
from tunebench.flags import config_from
from tunebench.format import duration


def plan_config(args: argparse.Namespace) -> tuple[RunConfig, bool, TrainConfig | None]:
    """A run config, or the run part of a train config (`--data`, or a YAML with a `data` key), with the flags
    over it; whether it is a train job that evaluates; and the train config itself."""
    if getattr(args, "data", None) or (args.config and "data" in (read_yaml(args.config) or {})):
        from tunebench.api.plan import evaluates, run_config

        train = config_from(args, TrainConfig)
        job = train.model_dump()
        return run_config(job), evaluates(job), train
    return config_from(args), False, None


def cmd_plan(args: argparse.Namespace) -> int:
    from tunebench.api import plan as api
    from tunebench.commands.run import store_of, world_sizes
    from tunebench.console import print_table
    from tunebench.plan import view

    if args.calibration:
        for table in view.calibration_tables():
            print_table(table, args.stdout)
        return 0
    if args.validate is not None:
        return _validate(args)
    cfg, evaluating, train = plan_config(args)
    store = store_of(args)
    if args.compare:
        strategies = args.strategies.split(",") if args.strategies else None
        rows = api.compare(cfg, args.gpu, world_sizes(args.gpus), strategies, store, evaluating)
        if args.json:
            out = [{"strategy": r.strategy, "world_size": r.world, "refused": r.refused,
                    "prediction": r.prediction.as_dict() if r.prediction else None} for r in rows]
            print(json.dumps(out, indent=2), file=args.stdout)
        else:
            print_table(view.compare_table(rows), args.stdout)
        return 0
    if args.max:
        return _largest(args, cfg, store)
    p = api.plan(cfg, args.gpu, None, store, evaluating)
    whole = api.job(train, p) if train is not None and args.data else None
    if args.json:
        out = p.as_dict()
        if whole is not None:
            out["job"] = {"steps": whole.steps, "seconds": whole.seconds, "eval_rows": whole.eval_rows,
                          "cost": whole.cost.lstrip(", ") or None} | {k: whole.stats.get(k) for k in JOB_STATS}
        print(json.dumps(out, indent=2), file=args.stdout)
        return 0
    for table in (view.summary_table(p), view.memory_table(p), view.time_table(p)):
        print_table(table, args.stdout)
    if whole is not None:
        st = whole.stats
        rows = "row pairs" if st["shape"] == "preference" else "rows"  # a pair: its chosen and its rejected row
        print(f"the job: {st['examples']:,} examples -> {st['rows']:,} {rows} of {st['seq_len']:,} tokens "
              f"({st['tokens']:,} tokens, {st['trained_tokens']:,} trained; {st['truncated']:,} truncated, "
              f"{st['dropped']:,} dropped"
              + (f", {whole.eval_rows:,} rows held out to evaluate" if whole.eval_rows else "") + f"); "
              f"{whole.steps:,} steps of {p.tokens_per_step:,} tokens: about {duration(whole.seconds)} on "
              f"{p.world} x {p.hw.gpu.name}{whole.cost} (the steps alone: evaluations and saving come on top)",
              file=args.stdout)
    return 0


JOB_STATS = ("examples", "rows", "seq_len", "tokens", "trained_tokens", "truncated", "dropped")



def _validate(args: argparse.Namespace) -> int:
    from tunebench.api import validate as api
    from tunebench.console import print_table, warn_skipped
    from tunebench.errors import UserError

    if not args.validate.strip():
        raise UserError("invalid validate='': give a results store, a results export or a folder of them")
    v = api.validate(args.validate)
    warn_skipped(v.skipped, args.validate)
    if args.json:
        def rows(checks: list) -> list[dict]:
            return [{"record": c.record.id, "set": c.set, "gpu": c.gpu, "config": c.label,
                     "peak_mem_allocated_bytes": c.record.metrics.peak_mem_allocated_bytes,
                     "predicted_peak_mem_allocated_bytes": c.predicted_mem, "memory_error": c.mem_error,
                     "tokens_per_s": c.record.metrics.tokens_per_s, "predicted_tokens_per_s": c.predicted_tps,
                     "tokens_per_s_error": c.tps_error, "verdict": c.verdict, "verdict_wrong": c.verdict_wrong,
                     "note": c.note or None} for c in checks]
        out = {"source": v.source, "runs": rows(v.checks),
               "spec_sheet": rows(v.spec_sheet) if v.spec_sheet is not None else None}
        print(json.dumps(out, indent=2), file=args.stdout)
        return 0
    for table in api.tables(v):
        print_table(table, args.stdout)
    return 0


def _largest(args: argparse.Namespace, cfg: RunConfig, store) -> int:
    from tunebench.api.limits import largest
    from tunebench.console import print_table
    from tunebench.document import Table
    from tunebench.format import config_label, fmt, gib

    lim = largest(cfg, args.max, args.gpu, None, store)
    p = lim.prediction
    if args.json:
        longer = None
        if lim.longer:
            options, size, q, capped = lim.longer
            longer = {"options": options, "value": size, "at_the_models_limit": capped, "prediction": q.as_dict()}
        print(json.dumps({"max": lim.what, "value": lim.value, "at_least": lim.at_least, "note": lim.note or None,
                          "prediction": p.as_dict() if p else None, "with_long_context_levers": longer,
                          "tried": [{"size": size, "verdict": q.verdict if q else None,
                                     "memory_needed_bytes": int(q.mem.total) if q else None,
                                     "tokens_per_s": q.tokens_per_s if q else None, "refused": why or None}
                                    for size, q, why in lim.tried]}, indent=2), file=args.stdout)
        return 0
    word = {"batch": "micro-batch", "seq-len": "sequence length", "model-size": "preset model"}[lim.what]
    if lim.value is None:
        head = f"no {word} fits: the smallest tried does not"
    else:
        value = f"{lim.value:,}" if isinstance(lim.value, int) else lim.value
        head = (f"the largest {word}: {'at least ' if lim.at_least else ''}{value}, needing {gib(p.mem.total)} of "
                f"{gib(p.hw.gpu.memory_bytes)} at {fmt(p.tokens_per_s, ',.0f')} tokens/s" + (f" ({lim.note})"
                                                                                            if lim.note else ""))
    label = config_label(cfg.model_dump())
    if lim.what == "model-size":  # every preset was planned: the configured model is not the question
        label = label.split(" ", 1)[1]
    on = p.hw.gpu.name if p else args.gpu or "this machine's GPU"
    print(f"tunebench plan --max {lim.what}: {label} on {on}: {head}", file=args.stdout)
    if lim.longer:
        options, size, q, capped = lim.longer
        print(f"  with {options}: {size:,}, needing {gib(q.mem.total)} and {gib(q.mem.host_bytes)} of host memory, "
              f"at {fmt(q.tokens_per_s, ',.0f')} tokens/s" + (" (the model's own limit: memory would allow more)"
                                                               if capped else ""), file=args.stdout)
    tab = Table([lim.what, "verdict", "needs", "tokens/s", "refused"], title="the sizes planned")
    for size, q, why in lim.tried:
        tab.add(f"{size:,}" if isinstance(size, int) else size, q.verdict if q else "-",
                gib(q.mem.total if q else None), fmt(q.tokens_per_s if q else None, ",.0f"), why)
    print_table(tab, args.stdout)
    return 0
