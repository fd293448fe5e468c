"""`tunebench eval`: a model's scores on lm-evaluation-harness tasks, stored as records of kind `eval`.

    subjects.py  what is scored: a model folder, an adapter on its base, a training job's output (and its base)
    tasks.py     the tasks: harness names or local task YAML files, built before any model is loaded
    harness.py   one model through the harness; its results as one row per task

A training job's output is scored as the fine-tuned model and the base it started from, each record naming the
job's record, so a report shows the two side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tunebench.config import EvalConfig
from tunebench.record import EvalMetrics, ResultRecord

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def preflight(cfg: EvalConfig, note: Callable[[str], None]) -> list:
    """What will be scored, its folders checked before any model is loaded."""
    from tunebench.evaluate.subjects import subjects

    return subjects(cfg.model, cfg.base, note)


def run_eval(cfg: EvalConfig, say: Callable[[str], None], train_record: str | None = None,
             tasks: list | None = None) -> Iterator[ResultRecord]:
    """One record per model and task, each yielded as soon as its model is scored. `train_record`: the id of the
    training job's record, where the job is scoring its own output (before its record.json is written);
    `tasks`: built already (evaluate.tasks.build)."""
    import torch

    from tunebench.environment import environment
    from tunebench.evaluate.harness import score
    from tunebench.evaluate.tasks import build

    found = preflight(cfg, say)
    tasks = tasks if tasks is not None else build(cfg.tasks, cfg.download)
    device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    precision = cfg.precision if cfg.precision != "auto" else ("bf16" if device == "cuda" else "fp32")
    env = environment(torch.device(device))
    for subject in found:
        say(f"eval: {subject.role} {subject.folder}" + (f" on {subject.base}" if subject.base else "") +
            f": {', '.join(cfg.tasks)}")
        model, tok = subject.load(getattr(torch, DTYPES[precision]), device)
        try:
            rows, secs = score(model, tok, tasks, cfg, device)
        finally:
            del model
        for row in rows:
            config, h = cfg.record_config(model=str(subject.folder), tasks=[row.task], precision=precision,
                                          device=device)
            m = EvalMetrics(task=row.task, metric=row.metric, value=row.value, stderr=row.stderr,
                            higher_is_better=row.higher_is_better, scores=row.scores, samples=row.samples,
                            samples_total=row.samples_total, num_fewshot=row.num_fewshot, model=str(subject.folder),
                            role=subject.role, train_record=train_record or subject.train_record,
                            output_dir=str(subject.output_dir) if subject.output_dir else None, eval_s=secs)
            shown = "-" if row.value is None else f"{row.value:.4f}" + (f" ± {row.stderr:.4f}" if row.stderr else "")
            say(f"eval: {subject.role} {row.task}: {row.metric} {shown} ({row.samples} examples)")
            yield ResultRecord(kind="eval", status="ok", config=config, config_hash=h, environment=env,
                               tags=cfg.tag, metrics=m)



def summary(rec: ResultRecord) -> dict:
    """An eval record as a training job's record lists it."""
    m = rec.metrics
    return {"role": m.role, "model": m.model, "task": m.task, "metric": m.metric, "value": m.value,
            "stderr": m.stderr, "samples": m.samples, "record": rec.id}
