"""Model loading: load time and memory per precision, and what each quantization saves against bf16."""

from __future__ import annotations

from tunebench.document import Section
from tunebench.record import ResultRecord
from tunebench.report.bench import load_table
from tunebench.report.context import ReportContext


def findings(load: list[ResultRecord]) -> list[str]:
    """Each quantized load against the bf16 one of the same model: memory saved, time taken."""
    ok = {(r.config["model"], r.config["precision"]): r.metrics for r in load if r.status == "ok"}
    lines = []
    for (model, precision), m in ok.items():
        base = ok.get((model, "bf16"))
        if precision == "bf16" or not base:
            continue
        mem, bmem = (m.mem_allocated_bytes, base.mem_allocated_bytes) if m.mem_allocated_bytes is not None \
            else (m.model_bytes, base.model_bytes)
        lines.append(f"{model} {precision}: {1 - mem / bmem:.1%} less memory than bf16, load "
                     f"{m.load_s:.2f} s against {base.load_s:.2f} s.")
    return lines


def section(ctx: ReportContext) -> Section | None:
    load = ctx.kind("load")
    if not load:
        return None
    t = load_table(load)
    t.title = ""  # the section's heading says it
    return Section("Model loading", [t, *findings(load)])
