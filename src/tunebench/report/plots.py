"""The report's plots (PNG, matplotlib's Agg backend). Each returns None when its data is absent."""

from __future__ import annotations

import collections
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tunebench.files import written_aside  # noqa: E402
from tunebench.format import label  # noqa: E402
from tunebench.record import ResultRecord  # noqa: E402
from tunebench.units import GIB  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    with written_aside(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def _barh(values: list[float], labels: list[str], xlabel: str, title: str, path: Path, fmt: str = "{:,.0f}") -> Path:
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(values) + 1.5))
    bars = ax.barh(range(len(values)), values, color="#3b6ea8")
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    for b, v in zip(bars, values):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, " " + fmt.format(v), va="center", fontsize=7)
    return _save(fig, path)


def throughput(ok: list[ResultRecord], out: Path, names: dict) -> Path | None:
    if not ok:
        return None
    return _barh([r.metrics.tokens_per_s for r in ok], [label(r, names) for r in ok], "tokens/s (global)",
                  "Training throughput", out / "throughput.png")


def step_times(ok: list[ResultRecord], out: Path, names: dict) -> Path | None:
    rows = [r for r in ok if r.metrics.step_time_s]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.5))
    for i, r in enumerate(rows):
        st = r.metrics.step_time_s
        ax.plot([st.p50 * 1e3, st.p99 * 1e3], [i, i], color="#999")
        for q, v, mk in (("p50", st.p50, "o"), ("p90", st.p90, "s"), ("p99", st.p99, "^")):
            ax.plot(v * 1e3, i, mk, color={"p50": "#3b6ea8", "p90": "#e08a2c", "p99": "#c23b3b"}[q],
                    label=q if i == 0 else None)
    ax.set_yticks(range(len(rows)), [label(r, names) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("step time (ms)")
    ax.set_title("Step-time distribution (p50 / p90 / p99)")
    ax.legend(fontsize=8)
    return _save(fig, out / "step_times.png")


def memory(ok: list[ResultRecord], out: Path, names: dict) -> Path | None:
    rows = [r for r in ok if r.metrics.peak_mem_allocated_bytes is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh([i - 0.2 for i in y], [r.metrics.peak_mem_reserved_bytes / GIB for r in rows], 0.4,
            label="peak reserved", color="#9dbbe0")
    ax.barh([i + 0.2 for i in y], [r.metrics.peak_mem_allocated_bytes / GIB for r in rows], 0.4,
            label="peak allocated", color="#3b6ea8")
    caps = {r.environment.get("gpu", {}).get("memory_bytes") for r in rows} - {None}
    for cap in caps:
        ax.axvline(cap / GIB, color="#c23b3b", linestyle="--", label=f"GPU capacity {cap / GIB:.0f} GiB")
    ax.set_yticks(list(y), [label(r, names) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GiB (largest rank)")
    ax.set_title("Peak memory against the GPU's capacity")
    ax.legend(fontsize=8)
    return _save(fig, out / "memory.png")


def mfu(ok: list[ResultRecord], out: Path, names: dict) -> Path | None:
    rows = [r for r in ok if r.metrics.mfu is not None]
    if not rows:
        return None
    return _barh([r.metrics.mfu * 100 for r in rows], [label(r, names) for r in rows], "MFU (%)",
                 "Model FLOPs utilisation (formula in each record)", out / "mfu.png", "{:.1f}%")


def scaling(ok: list[ResultRecord], out: Path) -> Path | None:
    series = collections.defaultdict(list)
    for r in ok:
        s = r.metrics.scaling
        if s:
            c = r.config
            series[(c["model"], c.get("strategy"), c["batch_size"], c["grad_accum"])].append(
                (r.metrics.world_size, s.efficiency, s.speedup))
    series = {k: sorted(v) for k, v in series.items() if len(v) > 1}
    if not series:
        return None
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    top = 1
    for (_model, strat, b, ga), pts in series.items():
        ws = [p[0] for p in pts]
        top = max(top, *ws)
        a1.plot(ws, [p[2] for p in pts], "o-", label=f"{strat} b{b}x{ga}")
        a2.plot(ws, [p[1] * 100 for p in pts], "o-", label=f"{strat} b{b}x{ga}")
    a1.plot([1, top], [1, top], "k--", label="ideal")
    a1.set(xlabel="GPUs", ylabel="speedup", title="Speedup vs ideal")
    a2.axhline(100, color="k", linestyle="--")
    a2.set(xlabel="GPUs", ylabel="efficiency (%)", title="Scaling efficiency = tok/s(N) / (N x tok/s(1))")
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    return _save(fig, out / "scaling.png")


def levers(effects: list[tuple[str, float]], out: Path) -> Path | None:
    if not effects:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(effects) + 1.5))
    vals = [e * 100 for _, e in effects]
    ax.barh(range(len(vals)), vals, color=["#3a8f4a" if v >= 0 else "#c23b3b" for v in vals])
    ax.set_yticks(range(len(vals)), [n for n, _ in effects], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="k")
    ax.set_xlabel("tokens/s change vs baseline (%)")
    ax.set_title("Diagnostic: each lever against the baseline")
    return _save(fig, out / "diagnostic.png")


def cost(rows: list[tuple[str, float]], out: Path) -> Path | None:
    if not rows:
        return None
    return _barh([v for _, v in rows], [n for n, _ in rows], "$ per 1M tokens (cheapest on-demand offering)",
                 "Cost", out / "cost.png", "${:.3f}")


def _lines(series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str, title: str, path: Path,
           ylog: bool = False) -> Path:
    """One line per series over a log2 x axis (sizes, batch sizes)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for key, pts in series.items():
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=key)
    ax.set_xscale("log", base=2)
    if ylog:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def busbw(rec: ResultRecord, out: Path, index: int = 0) -> Path | None:
    """busbw against message size per collective (nccl-tests' usual view)."""
    m = rec.metrics
    series = collections.defaultdict(list)
    for r in m.collectives:
        series[r["op"]].append((r["bytes"], r["busbw_gbps"]))
    if not series:
        return None
    return _lines(series, "size (bytes)", "busbw (GB/s)", f"Collectives, {m.collective_world_size} x "
                  f"{m.device_name} ({m.collective_backend})", out / f"collectives-{index}.png")


def infer_batches(records: list[ResultRecord], out: Path) -> Path | None:
    """Generated tokens/s against batch size, one line per model, precision and cache setup."""
    series = collections.defaultdict(list)
    for r in records:
        c = r.config
        key = f"{c['model']} {c['precision']} {c['kv_cache']}" + (" compile" if c.get("compile") else "")
        series[key].append((c["batch_size"], r.metrics.tokens_per_s))
    if not series:
        return None
    return _lines(series, "batch size", "generated tokens/s", "Inference throughput by batch size",
                  out / "inference.png", ylog=True)


def loss_curves(jobs: list[ResultRecord], out: Path, names: dict) -> Path | None:
    """Training loss per step (lines) and evaluation loss (points) of each training job."""
    jobs = [r for r in jobs if r.metrics.losses]
    if not jobs:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in jobs:
        line, = ax.plot(range(1, len(r.metrics.losses) + 1), r.metrics.losses, label=f"{label(r, names)} train")
        curve = r.metrics.job.eval_curve if r.metrics.job else []
        if curve:
            ax.plot([s for s, _ in curve], [v for _, v in curve], "o--", color=line.get_color(),
                    label=f"{label(r, names)} eval")
    ax.set(xlabel="optimizer step", ylabel="loss", title="Training jobs: loss curves")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, out / "loss_curves.png")


def pareto(points: list[tuple], front: set[str], out: Path, title: str,
           memory: str = "peak memory per GPU (GiB, allocated)") -> Path | None:
    """Tokens/s against peak memory for every measured candidate; the Pareto front named and joined.
    `points`: (tune.Point, name) pairs; `memory`: what their memory is (the axis's label)."""
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(10, 6))
    rest = [(p, n) for p, n in points if p.key not in front]
    best = sorted([(p, n) for p, n in points if p.key in front], key=lambda t: t[0].memory)
    ax.scatter([p.memory / GIB for p, _ in rest], [p.tokens_per_s for p, _ in rest], color="#999", label="measured")
    ax.plot([p.memory / GIB for p, _ in best], [p.tokens_per_s for p, _ in best], "o-", color="#c23b3b",
            label="Pareto front")
    middle = sum(p.memory for p, _ in points) / len(points) / GIB
    for p, name in best:
        cost = f", ${p.cost:.3f}/1M" if p.cost is not None else ""
        right = p.memory / GIB > middle  # labels on the right half read leftwards, inside the axes
        ax.annotate(f"{name}{cost}", (p.memory / GIB, p.tokens_per_s), fontsize=7, xytext=(-4 if right else 4, 4),
                    textcoords="offset points", ha="right" if right else "left")
    ax.set_xlabel(memory)
    ax.set_ylabel("tokens/s (global)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, out / "pareto.png")
