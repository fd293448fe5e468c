"""Training jobs: their loss curves, the time and cost their benchmark predicted against what they took, their
scores and where their model went."""

from __future__ import annotations

from pathlib import Path

from tunebench.document import Figure, Section, Table
from tunebench.format import fmt
from tunebench.report import plots
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    jobs = [r for r in ctx.train if r.metrics.job is not None]
    if not jobs:
        return None
    t = Table(["job", "status", "steps", "tokens", "train loss", "eval loss", "time (min)", "predicted (min)",
               "actual / predicted", "cost", "scores (base)", "outputs"])
    for r in jobs:
        j, m = r.metrics.job, r.metrics
        actual = j.tokens / m.tokens_per_s if m.tokens_per_s and j.tokens else None
        cost = ctx.costs.get(r.id)
        t.add(ctx.label(r), f"{r.status}, {j.exit}", f"{j.steps:,}/{j.planned_steps:,}", f"{j.tokens:,}",
              fmt(j.train_loss, ".4f"), fmt(j.eval_loss, ".4f"), fmt(actual, ".1f", 60),
              fmt(j.predicted_s, ".1f", 60) + (f" ({j.predicted_from})" if j.predicted_from else ""),
              "-" if not (actual and j.predicted_s) else f"{actual / j.predicted_s:.3f}",
              "-" if not (cost and actual) else f"${cost.dollars_per_hour * actual / 3600:.2f}",
              _scores(j.evaluations), _outputs(r))
    s = Section("Training jobs", [t, "Time is training time (steps x tokens per step / the job's measured tokens/s; "
                                     "evaluation and checkpoints left out); predicted time is the same tokens at the "
                                     "tokens/s of the stored benchmark of the same workload on the same GPU."])
    if pairs := _preference(ctx, jobs):
        s.add(pairs)
    if (p := plots.loss_curves(jobs, ctx.out, ctx.names)):
        s.add(Figure(p))
    return s


def _preference(ctx: ReportContext, jobs: list) -> Table | None:
    """Preference jobs' last evaluation: the rewards of the chosen and rejected answers, their margin, the share of
    pairs whose chosen answer wins."""
    rows = [r for r in jobs if r.metrics.job.preference]
    if not rows:
        return None
    t = Table(["job", "objective", "eval loss", "reward accuracy", "reward margin", "rewards chosen / rejected",
               "pairs"], title="preference jobs: the validation pairs at the last evaluation")
    for r in rows:
        p = r.metrics.job.preference
        t.add(ctx.label(r), r.config.get("objective", "sft"), fmt(p.get("loss"), ".4f"),
              fmt(p.get("reward_accuracy"), ".1%"), fmt(p.get("reward_margin"), ".4f"),
              f"{fmt(p.get('rewards_chosen'), '.4f')} / {fmt(p.get('rewards_rejected'), '.4f')}",
              fmt(p.get("pairs"), ","))
    return t


def _scores(evaluations: list[dict]) -> str:
    """'task metric 0.8100 (0.3300)': the fine-tuned model's score and, in brackets, its base's."""
    by = {(e["role"], e["task"]): e for e in evaluations}
    cells = []
    for task in dict.fromkeys(e["task"] for e in evaluations):
        tuned, base = by.get(("fine-tuned", task)), by.get(("base", task))
        if tuned and tuned.get("value") is not None:
            cells.append(f"{task} {tuned['metric']} {tuned['value']:.4f}" +
                         (f" ({base['value']:.4f})" if base and base.get("value") is not None else ""))
    return "; ".join(cells) or "-"


def _outputs(r) -> str:
    """The folders the job wrote, and any GGUF file exported into its output folder since."""
    out = r.config.get("output_dir")
    exported = sorted(p.name for p in Path(out).glob("*.gguf")) if out and Path(out).is_dir() else []
    return ", ".join([*r.metrics.job.outputs, *exported]) or "-"
