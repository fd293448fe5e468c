"""`tunebench tune`: parse, call tunebench.api.tune, print what was measured and what won."""

from __future__ import annotations

import argparse
import json

from tunebench.errors import UserError
from tunebench.flags import config_from

GOAL_DEFAULT = "throughput"


def _ints(text: str | None, what: str) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"invalid {what}={text}: expected a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise UserError(f"invalid {what}={text}: values must be positive integers")
    return values


def _names(text: str | None, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in (text or "").split(",") if x.strip())
    for n in names:
        if n not in allowed:
            raise UserError(f"invalid {what}={n}: choose from {', '.join(allowed)}")
    return names


def _goal_named_as_objective(args: argparse.Namespace, goals: tuple[str, ...]) -> None:
    """`--objective context` (throughput, cost, memory) is the tune's goal: a training objective is sft, dpo, simpo
    or orpo, so the two sets of words never meet; the config's objective then stays its default."""
    named = getattr(args, "objective", None)
    if named not in goals:
        return
    if args.goal not in (GOAL_DEFAULT, named):
        raise UserError(f"invalid objective={named}: it names the tune's goal, and --goal says {args.goal}")
    args.goal, args.objective = named, None


def settings_from(args: argparse.Namespace):
    from typing import get_args

    from tunebench.api.tune import Settings
    from tunebench.config.run import Optimizer, Strategy
    from tunebench.tune import OBJECTIVES, Space
    from tunebench.tune.space import CHECKPOINTING, LEVERS

    _goal_named_as_objective(args, OBJECTIVES)
    base = config_from(args)
    if args.goal not in OBJECTIVES:
        raise UserError(f"invalid goal={args.goal}: choose from {', '.join(OBJECTIVES)}")
    worlds = _ints(args.gpus, "gpus") or ((base.nproc_per_node or 1) * base.nnodes,)
    fixed = _names(args.fixed, LEVERS, "fixed")
    space = Space(worlds=worlds,
                  strategies=(base.strategy,) if "strategy" in fixed else _names(args.strategies, get_args(Strategy),
                                                                                  "strategies"),
                  optimizers=(base.optimizer,) if "optimizer" in fixed else _names(args.optimizers,
                                                                                    get_args(Optimizer), "optimizers"),
                  seq_lens=_ints(args.seq_lens, "seq_lens"),
                  compile=(base.compile,) if "compile" in fixed else (False, True),
                  checkpointing=((base.grad_ckpt, base.ckpt_every, base.ckpt_keep, base.ckpt_keep_every),)
                  if "checkpointing" in fixed
                  else CHECKPOINTING,
                  float8=(base.float8,) if "float8" in fixed else (),
                  memory=((base.mlp_chunk, base.offload),) if "memory" in fixed else (),
                  batches=(base.batch_size,) if "batch" in fixed else (),
                  global_batch=_ints(str(args.global_batch), "global_batch")[0] if args.global_batch else None)
    return Settings(base, args.goal, 12 if args.max_runs is None else args.max_runs,
                    60.0 if args.max_minutes is None else args.max_minutes, space, args.trial_warmup,
                    args.trial_steps, base.run_timeout or 900.0, args.prices)


def cmd_tune(args: argparse.Namespace) -> int:
    from tunebench.api import tune as api
    from tunebench.commands.run import store_of
    from tunebench.console import print_table, say
    from tunebench.tune.view import result_tables

    store = store_of(args) or None
    if store is None:
        raise UserError("tune stores every run (it resumes from the store): drop --no-store")
    settings = None if args.resume else settings_from(args)
    if settings is not None:
        api.check_settings(settings)
    out = args.out or "tunebench-tune"
    budget = {k: v for k, v in (("max_runs", args.max_runs), ("max_minutes", args.max_minutes)) if v is not None}
    result = api.tune(settings, store, out, resume=args.resume, on_event=say, budget=budget if args.resume else None,
                      force=args.force)
    if args.json:
        print(json.dumps(api.summary(result), indent=2), file=args.stdout)
    else:
        for table in result_tables(result):
            print_table(table, args.stdout)
    if result.best is None:
        say("tune: no candidate ran ok")
        return 1
    say(f"tune {result.id}: {result.runs} runs in {result.seconds / 60:.1f} min; best written to "
        f"{result.files['best']}" + (f"; resume or extend with --resume {result.id}" if result.runs else ""))
    return 0
