"""Memory: peak allocated, reserved and NVML-used against the GPU's capacity."""

from __future__ import annotations

from tunebench.document import Figure, Section, Table
from tunebench.format import gib
from tunebench.report import plots
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    p = plots.memory(ctx.ok, ctx.out, ctx.names)
    if not p:
        return None
    t = Table(["configuration", "peak allocated", "peak reserved", "NVML used", "GPU capacity"])
    for r in ctx.ok:
        m = r.metrics
        t.add(ctx.label(r), gib(m.peak_mem_allocated_bytes), gib(m.peak_mem_reserved_bytes),
              gib(m.nvml_mem_used_bytes), gib(r.environment.get("gpu", {}).get("memory_bytes"), ".0f"))
    return Section("Memory", [Figure(p), t])
