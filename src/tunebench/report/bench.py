"""Tables of `hw`, `load`, `infer` and `eval` records, for the terminal and the report alike."""

from __future__ import annotations

from pathlib import Path

from tunebench.document import Table
from tunebench.format import error_cell, fmt, pct
from tunebench.record import ResultRecord
from tunebench.units import GIB


def _tf(v: float | None) -> str:
    """TFLOP/s: one decimal on GPUs, three significant digits for a CPU's fractions of one."""
    return "-" if v is None else f"{v:,.1f}" if v >= 10 else f"{v:.3g}"


def hw_tables(rec: ResultRecord) -> list[Table]:
    m = rec.metrics
    where = m.device_name or rec.environment.get("device")
    out: list[Table] = []
    if m.matmul:
        title = (f"matmul on {where}: MAMF {_tf(m.mamf_tflops)} TFLOP/s {m.mamf_dtype} at "
                 f"{'x'.join(map(str, m.mamf_shape or []))}")
        if m.mamf_fraction_of_peak:
            title += f" ({m.mamf_fraction_of_peak:.1%} of the spec's dense bf16 peak)"
        out.append(Table(["dtype", "best mean TFLOP/s", "best median", "best max", "at m x n x k", "geomean",
                          "shapes"],
                         [[r["dtype"], _tf(r["best_mean_tflops"]), _tf(r["best_median_tflops"]),
                           _tf(r["best_max_tflops"]), "x".join(map(str, r["best_shape"])), _tf(r["geomean_tflops"]),
                           str(r["shapes_tried"])] for r in m.matmul], title))
    if m.host_dispatch_us is not None:
        d = m.host_dispatch or {}
        out.append(Table(["measurement", "us (median)", "us (best)"],
                         [[f"forward + backward of {d.get('layers')} layers of {d.get('width')}",
                           fmt(m.host_dispatch_us), fmt(d.get("best_us"))]],
                         f"host dispatch on {where} (one thread launching kernels)"))
    if m.copy_gbps is not None:
        rows = [["device copy (read + write)", fmt(m.device_copy["bytes"], ",.0f"), fmt(m.copy_gbps),
                 fmt(m.device_copy["best_gbps"])]]
        rows += [[f"{t['direction']} {t['memory']}", fmt(t["bytes"], ",.0f"), fmt(t["gbps"]), fmt(t["best_gbps"])]
                 for t in m.transfers]
        out.append(Table(["measurement", "bytes", "GB/s (median)", "GB/s (best)"], rows,
                         f"memory bandwidth on {where}"))
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
        out.append(Table(header, rows, f"collectives: {m.collective_world_size} ranks, {m.collective_backend} "
                                       "(busbw as nccl-tests)"))
    notes = [[s, v.splitlines()[0][:160]] for s, v in m.sections.items() if v != "ok"]
    if notes:
        out.append(Table(["section", "why"], notes, "sections not measured"))
    return out


def load_table(records: list[ResultRecord]) -> Table:
    rows = []
    for r in records:
        m = r.metrics
        rows.append([r.config["model"], r.config["precision"], r.status, fmt(m.load_s, ",.2f"),
                     fmt(m.read_gbps, ",.2f"),
                     fmt(m.model_bytes, ",.2f", GIB), fmt(m.mem_allocated_bytes, ",.2f", GIB), pct(m.mem_fraction),
                     fmt(m.peak_mem_allocated_bytes, ",.2f", GIB), fmt(m.rss_delta_bytes, ",.2f", GIB), m.cache or "-",
                     error_cell(r, last=True)])
    return Table(["model", "precision", "status", "load s", "read GB/s", "weights GiB", "GPU alloc GiB", "of GPU",
                  "peak alloc GiB", "host RSS +GiB", "page cache", "error"], rows,
                 "model loading (from_pretrained onto the device)")


def infer_table(records: list[ResultRecord]) -> Table:
    rows = []
    for r in records:
        m, c = r.metrics, r.config
        rows.append([c["model"], c["precision"], c["kv_cache"] + (" compile" if c.get("compile") else ""),
                     str(c["batch_size"]), r.status, fmt(m.tokens_per_s), fmt(m.ttft_s, ",.1f", 1e-3),
                     fmt(m.prefill_tokens_per_s, ",.0f"), fmt(m.decode_tokens_per_s), fmt(m.ms_per_token, ",.2f"),
                     fmt(m.weight_read_gbps, ",.0f"), fmt(m.peak_mem_allocated_bytes, ",.2f", GIB),
                     fmt(m.energy_j_per_token, ",.4f"), error_cell(r, last=True)])
    c = records[0].config if records else {}
    return Table(["model", "precision", "KV cache", "batch", "status", "tokens/s", "TTFT ms", "prefill tok/s",
                  "decode tok/s", "ms/step", "weights GB/s", "peak alloc GiB", "J/token", "error"], rows,
                 f"generation: prompt {c.get('prompt_len')} + {c.get('new_tokens')} new tokens per sequence, greedy")


def eval_table(records: list[ResultRecord]) -> Table:
    """One row per task, a column per model scored (a training job's fine-tuned model beside its base)."""
    models: list[tuple[str, str]] = []
    cells: dict[tuple[str, tuple[str, str]], str] = {}
    tasks: list[str] = []
    for r in records:
        m = r.metrics
        who = (m.role, m.model)
        models += [who] if who not in models else []
        tasks += [m.task] if m.task not in tasks else []
        value = "-" if m.value is None else f"{m.value:.4f}" + (f" ± {m.stderr:.4f}" if m.stderr else "")
        cells[(m.task, who)] = f"{m.metric} {value}" if m.metric else "-"
    samples = {r.metrics.task: r.metrics.samples for r in records}
    rows = [[t, fmt(samples.get(t), ",.0f")] + [cells.get((t, w), "-") for w in models] for t in tasks]
    heads = [f"{role}: {Path(model).name}" if role != "model" else Path(model).name for role, model in models]
    return Table(["task", "examples", *heads], rows, "lm-evaluation-harness scores (metric, value ± stderr)")
