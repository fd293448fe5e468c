"""MFU with the formulas used, and the fraction of the matmul rate `tunebench hw` measured (MAMF)."""

from __future__ import annotations

from tunebench.document import Figure, Section, Table
from tunebench.format import fmt
from tunebench.report import plots
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    p = plots.mfu(ctx.ok, ctx.out, ctx.names)
    if not p:
        return None
    s = Section("MFU", [Figure(p)])
    formulas = sorted({r.metrics.flops_formula.split(" = ")[0] for r in ctx.ok if r.metrics.flops_formula})
    s.add("Formulas used: " + "; ".join(f"`{f}`" for f in formulas) + ". Peak: dense bf16 FLOP/s of the GPU.")
    t = Table(["configuration", "model TFLOP/s per GPU", "MAMF TFLOP/s", "fraction of MAMF"])
    for r in ctx.ok:
        gpu = r.environment.get("gpu", {}).get("name")
        achieved = (r.metrics.flops_per_token or 0) * (r.metrics.tokens_per_s_per_gpu or 0) / 1e12
        if gpu in ctx.mamf and achieved:
            t.add(ctx.label(r), fmt(achieved), fmt(ctx.mamf[gpu]), f"{achieved / ctx.mamf[gpu]:.1%}")
    if t.rows:
        s.add("Against the matmul rate `tunebench hw` measured on the same GPU model (MAMF, bf16):", t)
    else:
        s.add("Fraction of measured MAMF: no `tunebench hw` result for these GPUs in this report.")
    return s
