"""`tunebench train`: a fine-tune on local data with the engine the benchmark measured.

Checked (config, model, strategy, tokenizer, output folder, checkpoint) before anything heavy; the data
tokenized once into the cache; the time and cost predicted from a stored benchmark of the same workload on
this GPU; then launched here or under torchrun, and saved like every result, with the adapter or model in
output_dir and the record beside it.
"""

from __future__ import annotations

import time
from pathlib import Path

from tunebench.api.plan import what_ran
from tunebench.api.records import finalize
from tunebench.config import RunConfig, TrainConfig, workload_key
from tunebench.config.base import identity as hashed_fields
from tunebench.console import say
from tunebench.data.prepare import Prepared, split_and_prepare
from tunebench.data.tokenizer import fingerprint, load_tokenizer
from tunebench.environment import environment
from tunebench.errors import UserError
from tunebench.files import write_text
from tunebench.format import duration, headline
from tunebench.launch import launcher_for
from tunebench.record import ResultRecord
from tunebench.run_preflight import preflight
from tunebench.store import Store, check_store_path, held_store
from tunebench.trainer import output
from tunebench.trainer.inputs import JobInputs
from tunebench.trainer.tracking import check as check_trackers

PREEMPTED = 75  # exit code of a job stopped by a signal with its checkpoint saved (EX_TEMPFAIL: run it again)


def predict(ran: TrainConfig, gpu: str | None, world: int, store: str | Path | None) -> dict | None:
    """tokens/s of the newest ok benchmark of this workload on this GPU and world size, if the store has one
    (`ran`: the job's config with its 'auto' choices made, as preflight made them: tunebench.choices.resolve)."""
    if not store or not Path(store).is_file():
        return None
    key = workload_key(RunConfig, ran.run_config().model_dump())
    with Store(store, create=False) as s:
        recs = [r for r in s.records("train") if r.status == "ok" and r.metrics.tokens_per_s
                and r.metrics.job is None and r.metrics.world_size == world
                and (r.environment.get("gpu", {}).get("name") or None) == gpu
                and workload_key(RunConfig, what_ran(r)) == key]
    if not recs:
        return None
    r = recs[-1]
    return {"tokens_per_s": r.metrics.tokens_per_s, "source": f"stored run {r.id[:12]}", "record_id": r.id}


def _announce(cfg: TrainConfig, total: int, world: int, pred: dict | None, gpu: str | None) -> None:
    rows = cfg.rows_per_micro * cfg.grad_accum * world
    tokens = total * rows * cfg.seq_len
    shown = f"{rows // 2} pairs (2 x {rows // 2} rows)" if cfg.preference else f"{rows}"
    line = f"train: {total:,} steps x {shown} x {cfg.seq_len} = {tokens:,} tokens"
    if pred:
        secs = tokens / pred["tokens_per_s"]
        line += f"; expected {duration(secs)} from {pred['source']} ({pred['tokens_per_s']:,.0f} tokens/s)"
        from tunebench.report.cost import on_demand_cost

        line += on_demand_cost(secs, world, gpu)
    else:
        line += f"; no stored benchmark of this workload on {gpu or 'this CPU'}: the time will be predicted from " \
                "the first timed steps"
    say(line)


def _prepare(cfg: TrainConfig, plan) -> tuple[JobInputs, Prepared]:
    tok = load_tokenizer(cfg, plan.spec)
    ck = output.claim(Path(cfg.output_dir), cfg.resume, cfg.overwrite)
    train_rows, eval_rows = split_and_prepare(cfg, tok)

    def damaged(stats: dict) -> str:  # '; 3 of 200 rows damaged, skipped (missing field 'completion' 2, ...)'
        bad = sorted((stats.get("bad_rows") or {}).items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{r} {n:,}" for r, n in bad[:3]) + (", ..." if len(bad) > 3 else "")
        return f"; {sum(n for _, n in bad):,} of {stats.get('rows_read', 0):,} rows damaged, skipped ({shown})" \
            if bad else ""

    st = train_rows.stats
    rows = f"{st['rows']:,} row pairs" if st["shape"] == "preference" else f"{st['rows']:,} rows"
    say(f"data: {st['examples']:,} examples ({st['shape']}) -> {rows} of {st['seq_len']} tokens, "
        f"{st['tokens']:,} tokens ({st['trained_tokens']:,} trained); {st['truncated']} truncated, {st['split']} "
        f"split, {st['dropped']} dropped" + damaged(st) +
        (f"; validation {eval_rows.stats['rows']:,} rows{damaged(eval_rows.stats)}" if eval_rows else ""))
    run_cfg = cfg.identity_config()
    identity = {"config": run_cfg.config_hash(),
                "data": st["fingerprint"], "tokenizer": fingerprint(tok),
                "seq_len": cfg.seq_len, "world_size": plan.world_size}
    if ck:
        output.check_resume(ck, identity, hashed_fields(RunConfig, run_cfg.model_dump()))
        say(f"train: resuming from {ck}")
    total = cfg.total_steps(train_rows.rows, plan.world_size)
    if ck:
        output.check_progress(ck, total)
    # what the job saves at its end is read now: the user's folders may change or go while it trains
    tok_dir = output.keep_tokenizer(Path(cfg.output_dir), tok)
    inputs = JobInputs(str(train_rows.path), str(eval_rows.path) if eval_rows else None, str(tok_dir), total,
                       identity, str(ck) if ck else None, generation=_generation(cfg, plan.spec, tok))
    return inputs, train_rows


def _generation(cfg: TrainConfig, spec, tok) -> dict:
    """The saved models' generation config: the model folder's, with the tokenizer's ids (models.save)."""
    from tunebench.models.save import generation_config

    own = cfg.tokenizer is None or (spec.path is not None and Path(cfg.tokenizer).expanduser().resolve() ==
                                    Path(spec.path).resolve())
    return generation_config(tok, spec.path, own).to_dict()


def train(cfg: TrainConfig, store: str | Path | None = None) -> ResultRecord | None:
    """The whole job; its record is saved to `store` (and written to output_dir/record.json)."""
    plan = preflight(cfg)
    if plan.spec.path is not None and not plan.spec.has_weights:  # a benchmark may time a shape; a job trains weights
        raise UserError(f"invalid model={cfg.model}: the folder holds no weights (*.safetensors) to fine-tune; "
                        "`run` benchmarks a folder's shape with random weights, `train` needs the model's own")
    check_trackers(cfg.track)
    tasks = None
    if cfg.eval_tasks:  # the tasks' names, files and data checked now, not after the training
        from tunebench.evaluate.tasks import build

        tasks = build(cfg.eval_tasks, download=False)
    if store:
        check_store_path(store)  # bad input below (the data) must leave nothing behind, not even a store
    with output.locked(Path(cfg.output_dir)):  # before the folder is read: one job in it at a time
        inputs, _ = _prepare(cfg, plan)
        with held_store(store):
            gpu = environment(plan.device)["gpu"]["name"]
            inputs.prediction = predict(plan.cfg, gpu, plan.world_size, store)
            _announce(cfg, inputs.total, plan.world_size, inputs.prediction, gpu)
            output.write_identity(Path(cfg.output_dir), inputs.identity, cfg)
            started = time.perf_counter()
            rec = launcher_for(cfg).launch(cfg, plan, inputs.to_json())
        if rec is None:
            return None
        scored = _evaluate(cfg, rec, tasks)
        rec = finalize(rec, store)
        write_text(Path(cfg.output_dir) / "record.json", rec.model_dump_json(indent=1))
        for e in scored:
            finalize(e, store)
    _summary(rec, time.perf_counter() - started)
    return rec


def _evaluate(cfg: TrainConfig, rec: ResultRecord, tasks: list | None) -> list[ResultRecord]:
    """eval_tasks' records for a completed job (the trained model and its base), listed in the job's record. A
    failure here is said and leaves the job's outputs and record as they are."""
    job = rec.metrics.job
    if not cfg.eval_tasks or rec.status != "ok" or job is None or job.exit != "completed":
        return []
    from tunebench.config import EvalConfig
    from tunebench.evaluate import run_eval, summary

    ecfg = EvalConfig(model=cfg.output_dir, tasks=cfg.eval_tasks, limit=cfg.eval_limit, tag=cfg.tag,
                      device="cpu" if cfg.device == "cpu" else "auto")
    try:
        scored = list(run_eval(ecfg, say, train_record=rec.id, tasks=tasks))
    except Exception as err:  # bad task input was refused before training; what is left is the harness's
        say(f"eval: failed, the job's outputs and record are kept: {type(err).__name__}: {headline(str(err))}")
        return []
    job.evaluations = [summary(e) for e in scored]
    return scored


def _summary(rec: ResultRecord, wall: float) -> None:
    job, m = rec.metrics.job, rec.metrics
    if job is None:
        say(f"train: {rec.status}: {headline(rec.error)}")
        return
    line = f"train: {job.exit} after {job.steps:,}/{job.planned_steps:,} steps in {wall / 60:.1f} min"
    if job.predicted_s and job.steps == job.planned_steps and m.tokens_per_s:
        actual = job.tokens / m.tokens_per_s
        line += f"; training time {actual / 60:.1f} min against {job.predicted_s / 60:.1f} min predicted " \
                f"({actual / job.predicted_s - 1:+.1%})"
    if job.preference:
        line += f"; eval loss {job.eval_loss:.4f}, reward accuracy {job.preference['reward_accuracy']:.1%}, margin " \
                f"{job.preference['reward_margin']:.4f}"
    elif job.eval_loss is not None:
        line += f"; eval loss {job.eval_loss:.4f} (perplexity {job.eval_perplexity:.2f})"
    if job.outputs:
        line += "; " + ", ".join(f"{k} in {v}" for k, v in job.outputs.items())
    say(line)
