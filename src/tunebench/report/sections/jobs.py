"""Training jobs: their loss curves, and the time and cost their benchmark predicted against what they took."""

from __future__ import annotations

from tunebench.document import Figure, Section, Table
from tunebench.format import fmt
from tunebench.report import plots
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    jobs = [r for r in ctx.train if r.metrics.job is not None]
    if not jobs:
        return None
    t = Table(["job", "status", "steps", "tokens", "train loss", "eval loss", "time (min)", "predicted (min)",
               "actual / predicted", "cost", "outputs"])
    for r in jobs:
        j, m = r.metrics.job, r.metrics
        actual = j.tokens / m.tokens_per_s if m.tokens_per_s and j.tokens else None
        cost = ctx.costs.get(r.id)
        t.add(ctx.label(r), f"{r.status}, {j.exit}", f"{j.steps:,}/{j.planned_steps:,}", f"{j.tokens:,}",
              fmt(j.train_loss, ".4f"), fmt(j.eval_loss, ".4f"), fmt(actual, ".1f", 60),
              fmt(j.predicted_s, ".1f", 60) + (f" ({j.predicted_from})" if j.predicted_from else ""),
              "-" if not (actual and j.predicted_s) else f"{actual / j.predicted_s:.3f}",
              "-" if not (cost and actual) else f"${cost.dollars_per_hour * actual / 3600:.2f}",
              ", ".join(j.outputs) or "-")
    s = Section("Training jobs", [t, "Time is training time (steps x tokens per step / the job's measured tokens/s; "
                                     "evaluation and checkpoints left out); predicted time is the same tokens at the "
                                     "tokens/s of the stored benchmark of the same workload on the same GPU."])
    if (p := plots.loss_curves(jobs, ctx.out, ctx.names)):
        s.add(Figure(p))
    return s
