"""Cost: each ok run on its cheapest on-demand offering, the same job on spot, and the prices used."""

from __future__ import annotations

from tunebench.document import Figure, Section, Table
from tunebench.report import plots
from tunebench.report.context import ReportContext


def section(ctx: ReportContext) -> Section | None:
    priced = [r for r in ctx.ok if ctx.costs[r.id]]
    gpus = sorted({g for r in ctx.ok if not ctx.costs[r.id] and (g := r.environment.get("gpu", {}).get("name"))})
    cpu = any(not r.environment.get("gpu", {}).get("name") for r in ctx.ok)
    notes = (["CPU runs have no GPU price, so they have no cost here."] if cpu else []) + (
        [f"No price in the price sheet matches {', '.join(gpus)}; pass --prices FILE with an offering for it."]
        if gpus else [])
    if not priced:
        return Section("Cost", notes) if notes else None
    t = Table(["configuration", "cheapest on-demand", "$/hour (all GPUs)", "$/1K samples", "$/1M tokens",
               "tokens per $", f"job of {ctx.job_samples:,} samples", "same job on spot"])
    for r in priced:
        k, sp = ctx.costs[r.id], ctx.spot[r.id]
        t.add(ctx.label(r), k.offering.provider, f"${k.dollars_per_hour:.2f}", f"${k.per_1k_samples:.4f}",
              f"${k.per_1m_tokens:.3f}", f"{k.tokens_per_dollar:,.0f}", f"{k.job_hours:.2f} h / ${k.job_cost:.2f}",
              "-" if not sp else f"${sp.job_cost:.2f} ({sp.offering.provider})")
    used = {ctx.costs[r.id].offering for r in priced} | {ctx.spot[r.id].offering for r in priced if ctx.spot[r.id]}
    s = Section("Cost", [t, "Prices: " + "; ".join(
        f"{o.provider} ${o.on_demand}/GPU-h on demand" + (f", ${o.spot} spot" if o.spot is not None else "")
        + f" ({o.source}, {o.date})" for o in sorted(used, key=lambda o: o.name)) + "."])
    if (p := plots.cost([(ctx.label(r), ctx.costs[r.id].per_1m_tokens) for r in priced], ctx.out)):
        s.add(Figure(p))
    return s.add(*notes)
