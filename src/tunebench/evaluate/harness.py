"""One model through lm-evaluation-harness: its HF model class (HFLM) around the model loaded here, the tasks
built beforehand (evaluate.tasks), and its results read into one row per task: every metric with its stderr,
the task's first metric as the one tables show."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TaskScore:
    task: str
    scores: dict[str, dict[str, float | None]] = field(default_factory=dict)  # metric -> {value, stderr}
    metric: str | None = None
    higher_is_better: bool | None = None
    samples: int | None = None
    samples_total: int | None = None
    num_fewshot: int | None = None

    @property
    def value(self) -> float | None:
        return self.scores.get(self.metric, {}).get("value") if self.metric else None

    @property
    def stderr(self) -> float | None:
        return self.scores.get(self.metric, {}).get("stderr") if self.metric else None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _scores(row: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """{'acc,none': .8, 'acc_stderr,none': .1} -> {'acc': {'value': .8, 'stderr': .1}} (a filter other than
    'none' stays in the name)."""
    out: dict[str, dict[str, float | None]] = {}
    for key, v in row.items():
        if "," not in key or "_stderr," in key:
            continue
        metric, filt = key.split(",", 1)
        name = metric if filt == "none" else key
        out[name] = {"value": _number(v), "stderr": _number(row.get(f"{metric}_stderr,{filt}"))}
    return out


def _read(results: dict[str, Any]) -> list[TaskScore]:
    rows = []
    for task, row in results.get("results", {}).items():
        scores = _scores(row)
        order = [m.get("metric") for m in (results.get("configs", {}).get(task, {}).get("metric_list") or [])]
        metric = next((m for m in order if m in scores), next(iter(scores), None))
        better = (results.get("higher_is_better", {}).get(task) or {}).get(metric) if metric else None
        n = results.get("n-samples", {}).get(task) or {}
        rows.append(TaskScore(task, scores, metric, better, n.get("effective"), n.get("original"),
                              results.get("n-shot", {}).get(task)))
    return rows


def score(model: Any, tokenizer: Any, tasks: list[Any], cfg, device: str) -> tuple[list[TaskScore], float]:
    """Every task's scores for one model, and the harness's time."""
    import lm_eval.loggers.utils as harness_env
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    # it runs `git describe` in whatever folder the user stands in: a hash of their repository, not the harness's,
    # and git's "fatal: not a git repository" on the terminal everywhere else
    harness_env.get_git_commit_hash = lambda: None
    for name in ("lm_eval", "lm-eval"):  # its notes on a model passed as an object are not the user's business
        logging.getLogger(name).setLevel(logging.ERROR)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, device=device, batch_size=cfg.batch_size)
    started = time.perf_counter()
    results = simple_evaluate(model=lm, tasks=tasks, num_fewshot=cfg.num_fewshot, limit=cfg.limit,
                              log_samples=False, apply_chat_template=cfg.apply_chat_template,
                              # the tasks are built already: without a manager the harness would index its whole
                              # registry again, for nothing
                              task_manager=TaskManager(include_defaults=False),
                              random_seed=cfg.seed, numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed,
                              fewshot_random_seed=cfg.seed)
    return _read(results or {}), time.perf_counter() - started
