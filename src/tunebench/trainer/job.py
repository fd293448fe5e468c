"""One training job on one rank: the benchmark's build and loop, fed from the prepared data.

The parent (tunebench.api.train) has checked the configuration, tokenized the data into the cache, found
the checkpoint to resume from and made the prediction; it hands this rank a JobInputs. Every rank returns
the same record; rank 0's is the one that counts.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from tunebench.data.batches import DatasetBatches, Position
from tunebench.data.prepare import Prepared, fullest_row_of
from tunebench.dist import SINGLE, DistContext
from tunebench.engine import checkpoint
from tunebench.engine.loop import LoopSpec, run_loop
from tunebench.engine.schedule import scheduler
from tunebench.engine.step import kernel_settings, optimizer_step_fn
from tunebench.metrics.flops import peak_flops
from tunebench.preflight import Plan
from tunebench.record import JobFigures, ResultRecord
from tunebench.runner import Outcome, attempt, build_trainable, telemetry_for
from tunebench.trainer.hooks import JobState, StopRequest, TrainHooks
from tunebench.trainer.inputs import JobInputs


def _counts(stats: dict) -> dict:
    """The data's figures for the record: the cache's own checksums left out."""
    return {k: v for k, v in stats.items() if k != "files"}


def _prepared(path: str | None) -> Prepared | None:
    return None if path is None else Prepared(Path(path), json.loads((Path(path) / "stats.json").read_text()))


def _resume(inputs: JobInputs, t, sched, ctx: DistContext) -> tuple[int, Position, JobState]:
    if not inputs.resume:
        return 0, Position(), JobState()
    ck = Path(inputs.resume)
    st = checkpoint.read_state(ck)
    t.ts.state.load(ck, ctx)
    sched.load_state_dict(torch.load(ck / "scheduler.pt", weights_only=False))
    checkpoint.load_rng(ck, ctx)
    return st["step"], Position(st["epoch"], st["micro"]), JobState(
        history=st["losses"], eval_curve=st["eval_curve"], target_s=st.get("target_s"),
        elapsed_before=st.get("elapsed_s", 0.0), preference=st.get("preference", []))


def _run(plan: Plan, inputs: JobInputs, out: Outcome, started: float, ctx: DistContext) -> None:
    cfg, device = plan.cfg, plan.device
    train, held = _prepared(inputs.data), _prepared(inputs.eval)
    t = build_trainable(plan, out, ctx, masked_labels=True, per_row=max(_pairs_per_row(train), _pairs_per_row(held)))
    sched = scheduler(t.ts.optimizer, cfg.schedule, cfg.warmup_steps, inputs.total)
    start, pos, state = _resume(inputs, t, sched, ctx)
    reference = held_reference = None
    if cfg.objective == "dpo" and cfg.precompute_reference:  # before the first step: the model is the reference
        from tunebench.trainer.pairs import reference_values

        with kernel_settings(cfg, device):
            reference = reference_values(t.ts.module, train, cfg, device, ctx, "train", start > 0)
            held_reference = reference_values(t.ts.module, held, cfg, device, ctx, "eval", start > 0)
    data = DatasetBatches(train, cfg.batch_size, device, cfg.seed, ctx.rank, ctx.world_size, pos, reference)
    stop = StopRequest(device)
    step_fn = optimizer_step_fn(t.ts, data, cfg, device, ctx, after_update=sched.step, stop_flag=stop.flag)

    def step() -> torch.Tensor:
        stop.before_step()
        return step_fn()

    hooks = TrainHooks(cfg, ctx, Path(cfg.output_dir), inputs.total, data, t.ts, sched, held,
                       inputs.identity, cfg.rows_per_micro * cfg.grad_accum * cfg.seq_len * ctx.world_size,
                       out.flops.model if out.flops else None,
                       peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None,
                       _trackers(cfg, ctx), state, held_reference=held_reference)
    try:
        with kernel_settings(cfg, device):  # the benchmark's kernels, evaluation included
            if hooks.eval_data is not None and start == 0:
                hooks.evaluate(0)  # where the loss starts: the curve's first point
            out.setup_s = time.perf_counter() - started
            warmup = min(cfg.warmup, max(0, (inputs.total - start) // 2))
            out.loop = run_loop(step, LoopSpec(inputs.total, warmup, start, cfg.fault), device, None, ctx,
                                telemetry_for(plan), hooks)
    finally:
        stop.restore()
        if hooks.trackers:
            hooks.trackers.close()
    out.job = _figures(inputs, train, hooks, out)
    if hooks.trackers:  # rank 0's: where its trackers keep the run, for the record
        out.job.trackers = hooks.trackers.locations()
    if out.loop.status == "ok" and not out.loop.stopped and out.loop.done == inputs.total:
        from transformers import AutoTokenizer, GenerationConfig

        from tunebench.trainer.export import write_outputs

        tok = AutoTokenizer.from_pretrained(inputs.tokenizer, local_files_only=True)
        gen = GenerationConfig.from_dict(inputs.generation or {})
        gen._from_model_config = False  # as resolved at the start (models.save.generation_config)
        out.job.outputs = write_outputs(t, cfg, plan.spec, tok, gen, Path(cfg.output_dir), ctx)
    out.loop.losses = state.history + out.loop.losses  # the whole job's curve, resumed steps included


def _pairs_per_row(prepared: Prepared | None) -> int:
    """Preference pairs a packed row pair holds at most (1 unpacked, or for other data, or none)."""
    if prepared is None or not prepared.stats.get("packing"):
        return 1
    return fullest_row_of(prepared)


def _trackers(cfg, ctx: DistContext):
    if not cfg.track or not ctx.is_main:
        return None
    from tunebench.trainer.tracking import Trackers

    return Trackers(cfg.track, Path(cfg.output_dir), Path(cfg.output_dir).name, cfg.model_dump())


def _figures(inputs: JobInputs, train: Prepared, hooks: TrainHooks, out: Outcome) -> JobFigures:
    loop, st, cfg = out.loop, hooks.state, hooks.cfg
    losses = st.history + loop.losses
    eval_loss = st.eval_curve[-1][1] if st.eval_curve else None
    pred = inputs.prediction or {}
    return JobFigures(
        data=_counts(train.stats), eval_data=_counts(hooks.eval_data.stats) if hooks.eval_data else None,
        steps=loop.done,
        planned_steps=inputs.total, epochs=loop.done * cfg.grad_accum / hooks.data.per_epoch,
        tokens=loop.done * hooks.tokens_per_step, train_loss=losses[-1] if losses else None, eval_loss=eval_loss,
        eval_perplexity=math.exp(min(eval_loss, 50)) if eval_loss is not None and cfg.objective == "sft" else None,
        eval_curve=st.eval_curve, target_eval_loss=cfg.target_eval_loss, time_to_target_s=st.target_s,
        preference=st.preference[-1][1] if st.preference else None, preference_curve=st.preference,
        train_s=hooks.elapsed(), predicted_tokens_per_s=pred.get("tokens_per_s"), predicted_from=pred.get("source"),
        predicted_s=inputs.total * hooks.tokens_per_step / pred["tokens_per_s"] if pred.get("tokens_per_s") else None,
        exit="preempted" if loop.stopped else "completed" if loop.status == "ok" else "stopped",
        resumed_from=inputs.resume, checkpoints=st.checkpoints)


def execute_train(plan: Plan, inputs: JobInputs, started: float | None = None, ctx: DistContext = SINGLE,
                  on_rank_figures=None) -> ResultRecord:
    """Run the job on this rank and return its record (the same on every rank)."""
    return attempt(plan, lambda out, t0: _run(plan, inputs, out, t0, ctx), started, ctx, on_rank_figures)


