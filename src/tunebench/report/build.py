"""The report: from records to report.md, a self-contained report.html, PNG plots, CSV and Parquet.

The document is built once as a list of sections (paragraphs, tables, images) and rendered to both
Markdown and HTML, so the two always say the same thing. Every sentence is computed from the rows;
a section appears only when its data exists.
"""

from __future__ import annotations

import base64
import csv
import html
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tunebench.record import ResultRecord, flat_row
from tunebench.report import plots
from tunebench.report.cost import DEFAULT_JOB_SAMPLES, Offering, cheapest
from tunebench.report.summary import fmt

GIB = 1024**3
NOISE = 0.05  # effects smaller than this are reported as no measurable change
CV_LIMIT = 0.02
IGNORED_KEYS = {"tag", "seed", "steps", "warmup", "node_rank", "rdzv_endpoint", "rdzv_id", "timeout", "device"}


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)  # str (paragraph), ("table", header, rows), ("image", path)


def _diff(base: dict, other: dict) -> dict[str, tuple]:
    keys = (set(base) | set(other)) - IGNORED_KEYS
    return {k: (base.get(k), other.get(k)) for k in sorted(keys) if base.get(k) != other.get(k)}


def lever_name(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items()) or "same configuration"


def _by_config(records: list[ResultRecord]) -> dict[str, list[ResultRecord]]:
    groups: dict[str, list[ResultRecord]] = {}
    for r in records:
        groups.setdefault(r.config_hash, []).append(r)
    return groups


def _mean_tps(rs: list[ResultRecord]) -> float | None:
    ok = [r.metrics.tokens_per_s for r in rs if r.status == "ok" and r.metrics.tokens_per_s]
    return statistics.fmean(ok) if ok else None


def build(records: list[ResultRecord], out: Path, prices: list[Offering], title: str,
          names: dict[str, str] | None = None, job_samples: int = DEFAULT_JOB_SAMPLES,
          mamf: dict[str, float] | None = None) -> list[Section]:
    """Write the plots into `out` and return the sections of the report on training records.

    `mamf`: bf16 MAMF (TFLOP/s) by GPU name, from `tunebench hw` records, for the fraction of MAMF.
    """
    names = names or {}
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in records if r.status == "ok" and r.metrics.tokens_per_s]
    groups = _by_config(records)
    secs: list[Section] = []
    costs = {r.id: cheapest(r, prices, job_samples=job_samples) for r in ok}
    spot = {r.id: cheapest(r, prices, spot=True, job_samples=job_samples) for r in ok}
    baseline = next((rs for rs in groups.values() if _mean_tps(rs)), None)

    # Executive summary
    s = Section("Executive summary")
    statuses = {st: sum(r.status == st for r in records) for st in ("ok", "oom", "failed", "nan", "timeout")}
    s.blocks.append(f"{len(records)} runs of {len(groups)} configurations: "
                    + ", ".join(f"{n} {st}" for st, n in statuses.items() if n) + ".")
    if ok:
        best = max(ok, key=lambda r: r.metrics.tokens_per_s)
        s.blocks.append(f"Highest throughput: **{plots.label(best, names)}** at {fmt(best.metrics.tokens_per_s)} "
                        f"tokens/s ({fmt(best.metrics.tokens_per_s_per_gpu)} per GPU on {best.metrics.world_size}).")
        with_mem = [r for r in ok if r.metrics.peak_mem_allocated_bytes]
        if with_mem:
            low = min(with_mem, key=lambda r: r.metrics.peak_mem_allocated_bytes)
            s.blocks.append(f"Lowest peak memory: **{plots.label(low, names)}** at "
                            f"{fmt(low.metrics.peak_mem_allocated_bytes, '.2f', GIB, ' GiB')} allocated.")
        priced = [r for r in ok if costs[r.id]]
        if priced:
            c = min(priced, key=lambda r: costs[r.id].per_1m_tokens)
            k = costs[c.id]
            s.blocks.append(f"Lowest cost per token: **{plots.label(c, names)}** at ${k.per_1m_tokens:.3f} per 1M "
                            f"tokens on {k.offering.provider} (on-demand ${k.offering.on_demand}/GPU-h).")
        if baseline and len(groups) > 1:
            b_tps = _mean_tps(baseline)
            s.blocks.append(f"Against the baseline ({plots.label(baseline[0], names)}, {fmt(b_tps)} tokens/s) the "
                            f"best configuration is {best.metrics.tokens_per_s / b_tps:.2f}x faster per token.")
    secs.append(s)

    # Training performance: every run, failures included
    s = Section("Training performance")
    rows = []
    for r in records:
        m = r.metrics
        st = m.step_time_s
        rows.append([plots.label(r, names), r.status, fmt(m.tokens_per_s), fmt(m.tokens_per_s_per_gpu),
                     fmt(m.samples_per_s, ",.3f"), "-" if not st else f"{st.p50 * 1e3:.1f}",
                     fmt(m.peak_mem_allocated_bytes, ".2f", GIB), "-" if m.mfu is None else f"{m.mfu:.1%}",
                     (r.error or "").strip().splitlines()[0][:80] if r.status != "ok" and r.error else ""])
    s.blocks.append(("table", ["configuration", "status", "tokens/s", "per GPU", "samples/s", "step p50 ms",
                               "peak alloc GiB", "MFU", "error"], rows))
    if (p := plots.throughput(ok, out, names)):
        s.blocks.append(("image", p))
    cvs = [(names.get(h, plots.label(rs[0], names)), statistics.stdev(t) / statistics.fmean(t))
           for h, rs in groups.items() if len(t := [r.metrics.tokens_per_s for r in rs if r in ok]) > 1]
    if cvs:
        s.blocks.append("Repeats: " + "; ".join(f"{n} CV {cv:.1%}" + (" (above 2%: noisy)" if cv > CV_LIMIT else "")
                                                for n, cv in cvs) + ".")
    secs.append(s)

    if (p := plots.step_times(ok, out, names)):
        secs.append(Section("Step-time distribution", [("image", p)]))

    if (p := plots.memory(ok, out, names)):
        s = Section("Memory", [("image", p)])
        s.blocks.append(("table", ["configuration", "peak allocated", "peak reserved", "NVML used", "GPU capacity"],
                         [[plots.label(r, names), fmt(r.metrics.peak_mem_allocated_bytes, ".2f", GIB, " GiB"),
                           fmt(r.metrics.peak_mem_reserved_bytes, ".2f", GIB, " GiB"),
                           fmt(r.metrics.nvml_mem_used_bytes, ".2f", GIB, " GiB"),
                           fmt(r.environment.get("gpu", {}).get("memory_bytes"), ".0f", GIB, " GiB")] for r in ok]))
        secs.append(s)

    if (p := plots.mfu(ok, out, names)):
        s = Section("MFU", [("image", p)])
        formulas = sorted({r.metrics.flops_formula.split(" = ")[0] for r in ok if r.metrics.flops_formula})
        s.blocks.append("Formulas used: " + "; ".join(f"`{f}`" for f in formulas) + ". Peak: dense bf16 FLOP/s "
                        "of the GPU.")
        rows = [[plots.label(r, names), fmt(achieved / 1e12), fmt(mamf[gpu]), f"{achieved / 1e12 / mamf[gpu]:.1%}"]
                for r in ok if (gpu := r.environment.get("gpu", {}).get("name")) in (mamf or {})
                and (achieved := (r.metrics.flops_per_token or 0) * (r.metrics.tokens_per_s_per_gpu or 0))]
        if rows:
            s.blocks += ["Against the matmul rate `tunebench hw` measured on the same GPU model (MAMF, bf16):",
                         ("table", ["configuration", "model TFLOP/s per GPU", "MAMF TFLOP/s", "fraction of MAMF"],
                          rows)]
        else:
            s.blocks.append("Fraction of measured MAMF: no `tunebench hw` result for these GPUs in this report.")
        secs.append(s)

    # Diagnostic: each configuration against the baseline
    if baseline and len(groups) > 1:
        b_tps = _mean_tps(baseline)
        b_mem = baseline[0].metrics.peak_mem_allocated_bytes
        effects, rows, worked, flat, broke = [], [], [], [], []
        for h, rs in groups.items():
            if rs is baseline:
                continue
            name = names.get(h) or lever_name(_diff(baseline[0].config, rs[0].config))
            tps = _mean_tps(rs)
            if tps is None:
                broke.append(f"{name}: {', '.join(sorted({r.status for r in rs}))}")
                rows.append([name, rs[0].status, "-", "-", "-"])
                continue
            eff = tps / b_tps - 1
            mem = rs[0].metrics.peak_mem_allocated_bytes
            dmem = None if not (mem and b_mem) else mem / b_mem - 1
            sps = statistics.fmean(r.metrics.samples_per_s for r in rs if r in ok) / \
                statistics.fmean(r.metrics.samples_per_s for r in baseline if r in ok) - 1
            effects.append((name, eff))
            rows.append([name, "ok", f"{eff:+.1%}", f"{sps:+.1%}", "-" if dmem is None else f"{dmem:+.1%}"])
            (worked if eff > NOISE else flat if eff >= -NOISE else broke).append(
                f"{name}: tokens/s {eff:+.1%}, samples/s {sps:+.1%}"
                + ("" if dmem is None else f", peak memory {dmem:+.1%}"))
        s = Section("Diagnostic analysis", [f"Baseline: {plots.label(baseline[0], names)}."])
        s.blocks.append(("table", ["lever", "status", "tokens/s", "samples/s", "peak memory"], rows))
        for head, items in (("What worked (more than +5% tokens/s)", worked),
                            ("No measurable effect (within ±5%)", flat),
                            ("What did not work (slower, or failed)", broke)):
            if items:
                s.blocks.append(f"**{head}:** " + "; ".join(items) + ".")
        if (p := plots.levers(effects, out)):
            s.blocks.append(("image", p))
        secs.append(s)

    scaled = [r for r in ok if r.metrics.scaling]
    if scaled:
        s = Section("Scaling", [("table", ["configuration", "GPUs", "tokens/s", "per GPU", "speedup", "efficiency"],
                                 [[plots.label(r, names), str(r.metrics.world_size), fmt(r.metrics.tokens_per_s),
                                   fmt(r.metrics.tokens_per_s_per_gpu), f"{r.metrics.scaling['speedup']:.2f}x",
                                   f"{r.metrics.scaling['efficiency']:.1%}"] for r in scaled])])
        s.blocks.append("Scaling efficiency = tokens/s(N) ÷ (N × tokens/s(1)), same per-GPU configuration.")
        if (p := plots.scaling(scaled, out)):
            s.blocks.append(("image", p))
        secs.append(s)

    priced = [r for r in ok if costs[r.id]]
    if priced:
        rows = []
        for r in priced:
            k, sp = costs[r.id], spot[r.id]
            rows.append([plots.label(r, names), k.offering.provider, f"${k.dollars_per_hour:.2f}",
                         f"${k.per_1k_samples:.4f}", f"${k.per_1m_tokens:.3f}", f"{k.tokens_per_dollar:,.0f}",
                         f"{k.job_hours:.2f} h / ${k.job_cost:.2f}",
                         "-" if not sp else f"${sp.job_cost:.2f} ({sp.offering.provider})"])
        s = Section("Cost", [("table", ["configuration", "cheapest on-demand", "$/hour (all GPUs)", "$/1K samples",
                                        "$/1M tokens", "tokens per $", f"job of {job_samples:,} samples",
                                        "same job on spot"], rows)])
        used = {costs[r.id].offering for r in priced} | {spot[r.id].offering for r in priced if spot[r.id]}
        s.blocks.append("Prices: " + "; ".join(f"{o.provider} ${o.on_demand}/GPU-h on demand"
                                               + (f", ${o.spot} spot" if o.spot is not None else "")
                                               + f" ({o.source}, {o.date})" for o in sorted(used, key=lambda o: o.name))
                        + ".")
        if (p := plots.cost([(plots.label(r, names), costs[r.id].per_1m_tokens) for r in priced], out)):
            s.blocks.append(("image", p))
        secs.append(s)
    elif ok:
        secs.append(Section("Cost", ["No price in the price sheet matches these runs' devices "
                                     f"({', '.join(sorted({r.environment.get('gpu', {}).get('name') or 'cpu' for r in ok}))}); "
                                     "pass --prices FILE with an offering for them."]))

    secs.append(Section("Recommendations", recommendations(records, ok, groups, baseline, costs, names)))
    return secs


def recommendations(records, ok, groups, baseline, costs, names) -> list[str]:
    """Sentences computed from the rows; none is written when its data is missing."""
    out = []
    if ok:
        best = max(ok, key=lambda r: r.metrics.tokens_per_s)
        line = f"For throughput, use {plots.label(best, names)} ({fmt(best.metrics.tokens_per_s)} tokens/s"
        if best.metrics.peak_mem_allocated_bytes:
            line += f", {fmt(best.metrics.peak_mem_allocated_bytes, '.2f', GIB, ' GiB')} peak"
        out.append(line + ").")
    if baseline and len(groups) > 1:
        b_tps = _mean_tps(baseline)
        for h, rs in groups.items():
            tps = _mean_tps(rs)
            if rs is baseline or tps is None:
                continue
            eff = tps / b_tps - 1
            name = names.get(h) or lever_name(_diff(baseline[0].config, rs[0].config))
            if abs(eff) > NOISE:
                out.append(f"{name}: {'gains' if eff > 0 else 'loses'} {abs(eff):.0%} tokens/s against the baseline.")
    for r in records:
        if r.status in ("oom", "timeout", "failed", "nan"):
            out.append(f"{plots.label(r, names)} ended with status {r.status}: "
                       + {"oom": "it does not fit this GPU; lower the batch or enable grad_ckpt.",
                          "timeout": "it did not finish within its time limit.",
                          "failed": "see its error in the store (tunebench results show).",
                          "nan": "the loss diverged; lower the learning rate."}[r.status])
    eff_rows = [r for r in ok if r.metrics.scaling and r.metrics.world_size > 1]
    for r in eff_rows:
        e = r.metrics.scaling["efficiency"]
        out.append(f"{r.config.get('strategy')} at {r.metrics.world_size} GPUs keeps {e:.0%} scaling efficiency"
                   + (" (at least 90%: scale out freely)." if e >= 0.9 else " (below 90%: communication costs show)."))
    priced = [r for r in ok if costs.get(r.id)]
    if len(priced) > 1:
        c = min(priced, key=lambda r: costs[r.id].per_1m_tokens)
        out.append(f"For cost, {plots.label(c, names)} is cheapest per token (${costs[c.id].per_1m_tokens:.3f} per 1M "
                   f"tokens on {costs[c.id].offering.provider}).")
    return out or ["No successful run in this selection: nothing to recommend."]


def to_markdown(title: str, secs: list[Section], out: Path) -> str:
    lines = [f"# {title}", ""]
    for s in secs:
        lines += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, str):
                lines += [b, ""]
            elif b[0] == "table":
                lines += ["| " + " | ".join(b[1]) + " |", "|" + "---|" * len(b[1])]
                lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in b[2]] + [""]
            else:
                lines += [f"![{b[1].stem}]({b[1].relative_to(out).as_posix()})", ""]
    return "\n".join(lines)


def _inline_md(text: str) -> str:
    """The little Markdown the paragraphs use (**bold**, `code`), escaped for HTML."""
    import re

    t = html.escape(text)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


def to_html(title: str, secs: list[Section]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
             "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px}"
             "th{background:#eef2f7}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]
    for s in secs:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, str):
                parts.append(f"<p>{_inline_md(b)}</p>")
            elif b[0] == "table":
                parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in b[1]) + "</tr>")
                parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in b[2]]
                parts.append("</table>")
            else:
                data = base64.b64encode(b[1].read_bytes()).decode()
                parts.append(f"<img alt='{b[1].stem}' src='data:image/png;base64,{data}'>")
    # Marks the page once every plot has decoded, so a browser test (or a person) can check it.
    parts.append("<script>window.addEventListener('load',()=>{const im=[...document.images];"
                 "document.body.dataset.images=im.length;document.body.dataset.imagesDecoded="
                 "im.filter(i=>i.complete&&i.naturalWidth>0).length;});</script></body></html>")
    return "\n".join(parts)


def _parquet_safe(rows: list[dict]) -> list[dict]:
    """One type per column: numbers become floats where a column mixes ints and floats, else text."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    for c in cols:
        kinds = {type(r.get(c)) for r in rows} - {type(None)}
        if kinds <= {int, float} and float in kinds:
            for r in rows:
                r[c] = None if r.get(c) is None else float(r[c])
        elif len(kinds) > 1:
            for r in rows:
                r[c] = None if r.get(c) is None else str(r[c])
    return [{c: r.get(c) for c in cols} for r in rows]


def write_tables(records: list[ResultRecord], out: Path) -> None:
    rows = [flat_row(r) for r in records]
    cols = list(dict.fromkeys(k for row in rows for k in row))
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(_parquet_safe([dict(r) for r in rows])), out / "results.parquet")


def write_report(records: list[ResultRecord], out: Path, prices: list[Offering], title: str,
                 names: dict[str, str] | None = None, job_samples: int = DEFAULT_JOB_SAMPLES) -> list[Path]:
    from tunebench.report import bench

    out.mkdir(parents=True, exist_ok=True)
    train = [r for r in records if r.kind == "train"]
    mamf = {r.metrics.device_name: r.metrics.mamf_tflops for r in records
            if r.kind == "hw" and r.metrics.mamf_dtype == "bf16" and r.metrics.mamf_tflops}
    secs = build(train, out, prices, title, names, job_samples, mamf) if train else []
    secs += bench.sections([r for r in records if r.kind != "train"], out)
    (out / "report.md").write_text(to_markdown(title, secs, out))
    (out / "report.html").write_text(to_html(title, secs))
    write_tables(records, out)
    return sorted(out.iterdir())
