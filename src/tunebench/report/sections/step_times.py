"""Step-time distribution: p50 / p90 / p99 of every ok run."""

from __future__ import annotations

from tunebench.document import Figure, Section
from tunebench.report import plots
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    p = plots.step_times(ctx.ok, ctx.out, ctx.names)
    return Section("Step-time distribution", [Figure(p)]) if p else None
