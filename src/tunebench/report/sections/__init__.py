"""The report's sections, in the order they appear. Each module's ``section(ctx)`` returns a Section,
or None when its data is absent; adding a section is one module and one line here."""

from __future__ import annotations

from collections.abc import Callable

from tunebench.document import Section
from tunebench.report.context import ReportContext
from tunebench.report.sections import (
    cost,
    diagnostic,
    evaluation,
    hardware,
    inference,
    jobs,
    loading,
    memory,
    mfu,
    next_steps,
    performance,
    planner,
    recommendations,
    scaling,
    step_times,
    summary,
)

SECTIONS: list[Callable[[ReportContext], Section | None]] = [
    summary.section, performance.section, jobs.section, evaluation.section, step_times.section, memory.section,
    planner.section, mfu.section, diagnostic.section,
    scaling.section, cost.section, recommendations.section, next_steps.section, hardware.section, loading.section,
    inference.section,
]


def build(ctx: ReportContext) -> list[Section]:
    return [s for make in SECTIONS if (s := make(ctx)) is not None]
