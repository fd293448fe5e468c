"""Evaluation: lm-evaluation-harness scores, a training job's fine-tuned model beside the base it started from."""

from __future__ import annotations

from tunebench.document import Section, Table
from tunebench.format import fmt
from tunebench.report.bench import eval_table
from tunebench.report.context import ReportContext


def _score(m) -> str:
    return "-" if m is None or m.value is None else f"{m.value:.4f}" + (f" ± {m.stderr:.4f}" if m.stderr else "")


def section(ctx: ReportContext) -> Section | None:
    evals = [r for r in ctx.kind("eval") if r.status == "ok"]
    if not evals:
        return None
    s = Section("Evaluation", ["Scores from lm-evaluation-harness (the task's first metric, ± its standard error)."])
    jobs = {r.id: r for r in ctx.train}
    for job_id in dict.fromkeys(r.metrics.train_record for r in evals if r.metrics.train_record):
        mine = [r for r in evals if r.metrics.train_record == job_id]
        latest = {(r.metrics.role, r.metrics.task): r.metrics for r in sorted(mine, key=lambda r: r.created_at)}
        t = Table(["task", "metric", "examples", "base", "fine-tuned", "change"],
                  title=f"job {ctx.label(jobs[job_id]) if job_id in jobs else job_id[:8]}: base vs fine-tuned")
        for task in dict.fromkeys(r.metrics.task for r in mine):
            base, tuned = latest.get(("base", task)), latest.get(("fine-tuned", task))
            either = tuned or base
            change = tuned.value - base.value if base and tuned and None not in (base.value, tuned.value) else None
            t.add(task, either.metric or "-", fmt(either.samples, ",.0f"), _score(base), _score(tuned),
                  "-" if change is None else f"{change:+.4f}")
        s.add(t)
    alone = [r for r in evals if not r.metrics.train_record]
    if alone:
        s.add(eval_table(alone))
    return s
