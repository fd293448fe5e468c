"""Tables and report sections for `hw`, `load` and `infer` records.

Each table is (title, header, rows of strings), rendered by rich on the console and by the report
as Markdown/HTML, so the two show the same figures.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from tunebench.record import ResultRecord
from tunebench.report import plots
from tunebench.report.summary import fmt

GIB = 1024**3
TableData = tuple[str, list[str], list[list[str]]]


def rich_table(title: str, header: list[str], rows: list[list[str]]) -> Table:
    t = Table(title=title, title_justify="left")
    for h in header:
        t.add_column(h)
    for row in rows:
        t.add_row(*row)
    return t


def _tf(v: float | None) -> str:
    """TFLOP/s: one decimal on GPUs, three significant digits for a CPU's fractions of one."""
    return "-" if v is None else f"{v:,.1f}" if v >= 10 else f"{v:.3g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def hw_tables(rec: ResultRecord) -> list[TableData]:
    m = rec.metrics
    where = m.device_name or rec.environment.get("device")
    out: list[TableData] = []
    if m.matmul:
        title = (f"matmul on {where}: MAMF {_tf(m.mamf_tflops)} TFLOP/s {m.mamf_dtype} at "
                 f"{'x'.join(map(str, m.mamf_shape or []))}")
        if m.mamf_fraction_of_peak:
            title += f" ({m.mamf_fraction_of_peak:.1%} of the spec's dense bf16 peak)"
        out.append((title, ["dtype", "best mean TFLOP/s", "best median", "best max", "at m x n x k", "geomean",
                            "shapes"],
                    [[r["dtype"], _tf(r["best_mean_tflops"]), _tf(r["best_median_tflops"]), _tf(r["best_max_tflops"]),
                      "x".join(map(str, r["best_shape"])), _tf(r["geomean_tflops"]), str(r["shapes_tried"])]
                     for r in m.matmul]))
    if m.copy_gbps is not None:
        rows = [["device copy (read + write)", fmt(m.device_copy["bytes"], ",.0f"), fmt(m.copy_gbps),
                 fmt(m.device_copy["best_gbps"])]]
        rows += [[f"{t['direction']} {t['memory']}", fmt(t["bytes"], ",.0f"), fmt(t["gbps"]), fmt(t["best_gbps"])]
                 for t in m.transfers]
        out.append((f"memory bandwidth on {where}", ["measurement", "bytes", "GB/s (median)", "GB/s (best)"], rows))
    if m.collectives:
        ops = list(dict.fromkeys(r["op"] for r in m.collectives))
        by = {(r["op"], r["bytes"]): r for r in m.collectives}
        rows = []
        for size in sorted({r["bytes"] for r in m.collectives}):
            row = [fmt(size, ",.0f")]
            for op in ops:
                r = by.get((op, size))
                row += ["-", "-", "-"] if not r else [fmt(r["time_us"]), fmt(r["algbw_gbps"], ",.2f"),
                                                      fmt(r["busbw_gbps"], ",.2f")]
            rows.append(row)
        header = ["bytes"] + [f"{op} {col}" for op in ops for col in ("time us", "algbw GB/s", "busbw GB/s")]
        out.append((f"collectives: {m.collective_world_size} ranks, {m.collective_backend} (busbw as nccl-tests)",
                    header, rows))
    notes = [[s, v.splitlines()[0][:160]] for s, v in m.sections.items() if v != "ok"]
    if notes:
        out.append(("sections not measured", ["section", "why"], notes))
    return out


def load_table(records: list[ResultRecord]) -> TableData:
    rows = []
    for r in records:
        m = r.metrics
        rows.append([r.config["model"], r.config["precision"], r.status, fmt(m.load_s, ",.2f"), fmt(m.read_gbps, ",.2f"),
                     fmt(m.model_bytes, ",.2f", GIB), fmt(m.mem_allocated_bytes, ",.2f", GIB), _pct(m.mem_fraction),
                     fmt(m.peak_mem_allocated_bytes, ",.2f", GIB), fmt(m.rss_delta_bytes, ",.2f", GIB), m.cache or "-",
                     _error(r)])
    return ("model loading (from_pretrained onto the device)",
            ["model", "precision", "status", "load s", "read GB/s", "weights GiB", "GPU alloc GiB", "of GPU",
             "peak alloc GiB", "host RSS +GiB", "page cache", "error"], rows)


def infer_table(records: list[ResultRecord]) -> TableData:
    rows = []
    for r in records:
        m, c = r.metrics, r.config
        rows.append([c["model"], c["precision"], c["kv_cache"] + (" compile" if c.get("compile") else ""),
                     str(c["batch_size"]), r.status, fmt(m.tokens_per_s), fmt(m.ttft_s, ",.1f", 1e-3),
                     fmt(m.prefill_tokens_per_s, ",.0f"), fmt(m.decode_tokens_per_s), fmt(m.ms_per_token, ",.2f"),
                     fmt(m.weight_read_gbps, ",.0f"), fmt(m.peak_mem_allocated_bytes, ",.2f", GIB),
                     fmt(m.energy_j_per_token, ",.4f"), _error(r)])
    c = records[0].config if records else {}
    return (f"generation: prompt {c.get('prompt_len')} + {c.get('new_tokens')} new tokens per sequence, greedy",
            ["model", "precision", "KV cache", "batch", "status", "tokens/s", "TTFT ms", "prefill tok/s",
             "decode tok/s", "ms/step", "weights GB/s", "peak alloc GiB", "J/token", "error"], rows)


def _error(r: ResultRecord) -> str:
    return (r.error or "").strip().splitlines()[-1][:80] if r.status != "ok" and r.error else ""


def sections(records: list[ResultRecord], out: Path) -> list:
    """The report's Hardware, Model loading and Inference sections (each only when its records exist)."""
    from tunebench.report.build import Section

    secs = []
    hw = [r for r in records if r.kind == "hw"]
    if hw:
        s = Section("Hardware")
        for i, r in enumerate(hw):
            s.blocks.append(f"`tunebench hw` on {r.metrics.device_name} ({r.created_at[:10]}, status {r.status}"
                            + (", quick" if r.config.get("quick") else "") + ").")
            for title, header, rows in hw_tables(r):
                s.blocks += [f"**{title}**", ("table", header, rows)]
            if (p := plots.busbw(r, out, i)):
                s.blocks.append(("image", p))
        s.blocks.append("MAMF: the highest per-shape mean TFLOP/s of a matmul sweep (stas00's mamf-finder method). "
                        "Copy bandwidth counts read + write. busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for "
                        "all-gather and reduce-scatter (nccl-tests).")
        secs.append(s)
    load = [r for r in records if r.kind == "load"]
    if load:
        title, header, rows = load_table(load)
        s = Section("Model loading", [("table", header, rows)])
        s.blocks += _load_findings(load)
        secs.append(s)
    infer = [r for r in records if r.kind == "infer"]
    if infer:
        title, header, rows = infer_table(infer)
        s = Section("Inference", [title + ".", ("table", header, rows)])
        ok = [r for r in infer if r.status == "ok"]
        if (p := plots.infer_batches(ok, out)):
            s.blocks.append(("image", p))
        if ok:
            best = max(ok, key=lambda r: r.metrics.tokens_per_s)
            fast = min(ok, key=lambda r: r.metrics.ttft_s)
            s.blocks.append(f"Highest throughput: {best.config['model']} {best.config['precision']} at batch "
                            f"{best.config['batch_size']}, {fmt(best.metrics.tokens_per_s)} tokens/s. Shortest time to "
                            f"first token: {fast.config['precision']} at batch {fast.config['batch_size']}, "
                            f"{fast.metrics.ttft_s * 1e3:,.1f} ms.")
        secs.append(s)
    return secs


def _load_findings(load: list[ResultRecord]) -> list[str]:
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
