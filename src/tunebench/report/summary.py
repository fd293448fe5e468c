"""The readable summary of one run, and the one-line-per-run listing of a store."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tunebench.record import ResultRecord

GIB = 1024**3


def fmt(v: float | int | None, spec: str = ",.1f", scale: float = 1.0, unit: str = "") -> str:
    """A number for a table: '-' when it was not measured."""
    return "-" if v is None else f"{v / scale:{spec}}{unit}"


def run_table(rec: ResultRecord) -> Table:
    c, m = rec.config, rec.metrics
    gpu = rec.environment.get("gpu", {}).get("name") or rec.environment.get("device", "cpu")
    t = Table(title=f"tunebench run {rec.id[:12]}  status: {rec.status}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    rows = [
        ("workload", f"{c['model']} {c['method']} {c['precision']}  batch {c['batch_size']} x accum "
                     f"{c['grad_accum']} x seq {c['seq_len']}  opt {c['optimizer']}  ckpt {c['grad_ckpt']}"),
        ("device", f"{gpu} x {m.world_size}" + (f" on {m.nnodes} nodes" if m.nnodes > 1 else "")
                   + f"  strategy {c.get('strategy', 'single')}"),
        ("tokens/s", f"{fmt(m.tokens_per_s)}  ({fmt(m.tokens_per_s_per_gpu)} per device)"),
        ("samples/s", fmt(m.samples_per_s, ",.3f")),
        ("step time p50/p90/p99", "-" if not m.step_time_s else
         f"{m.step_time_s.p50 * 1e3:.1f} / {m.step_time_s.p90 * 1e3:.1f} / {m.step_time_s.p99 * 1e3:.1f} ms"
         f"  (mean {m.step_time_s.mean * 1e3:.1f}, std {m.step_time_s.std * 1e3:.1f})"),
        ("peak memory alloc/reserved", f"{fmt(m.peak_mem_allocated_bytes, '.2f', GIB, ' GiB')} / "
                                       f"{fmt(m.peak_mem_reserved_bytes, '.2f', GIB, ' GiB')}"
                                       f"  (NVML used {fmt(m.nvml_mem_used_bytes, '.2f', GIB, ' GiB')})"),
        ("peak host RSS", fmt(m.peak_rss_bytes, ".2f", GIB, " GiB")),
        ("MFU / HFU", "-" if m.mfu is None else f"{m.mfu:.1%} / {m.hfu:.1%}"),
        ("FLOPs/token", fmt(m.flops_per_token, ".3e")),
        ("params trainable/total", f"{fmt(m.params_trainable, ',.0f')} / {fmt(m.params_total, ',.0f')}"),
        ("setup", fmt(m.setup_s, ".1f", unit=" s") + f"  (weights: {m.weights or '-'})"),
        ("loss first/last", f"{fmt(m.loss_first, '.4f')} / {fmt(m.loss_last, '.4f')}"),
    ]
    if m.telemetry:
        t_ = m.telemetry
        rows.append(("GPU telemetry", f"util {t_['gpu_util_mean_pct']:.0f}%, power {t_['power_mean_w']:.0f} W, "
                                      f"energy {fmt(m.energy_j_per_token, '.4f')} J/token, max {t_['temperature_max_c']} C,"
                                      f" SM clock min {t_['sm_clock_min_mhz']} MHz, throttle: "
                                      f"{', '.join(t_['throttle_reasons']) or 'none'}"))
    if m.step_time_skew is not None and m.world_size > 1:
        rows.append(("rank step-time skew", f"{m.step_time_skew:.1%}"))
    if m.scaling:
        rows.append(("scaling", f"speedup {m.scaling['speedup']:.2f}x, efficiency {m.scaling['efficiency']:.1%} "
                                f"vs world size {m.scaling['baseline_world_size']}"))
    if rec.error:
        rows.append(("error", rec.error.strip().splitlines()[-1][:300]))
    for k, v in rows:
        t.add_row(k, v)
    return t


def list_table(records: list[ResultRecord]) -> Table:
    t = Table(title=f"{len(records)} results")
    for col in ("id", "created", "kind", "status", "model", "method / what", "device", "tokens/s", "peak alloc",
                "tags"):
        t.add_column(col)
    for r in records:
        m = r.metrics
        what = r.config.get("method") or r.config.get("precision") or ",".join(r.config.get("sections", []))
        t.add_row(r.id[:12], r.created_at.replace("+00:00", "Z"), r.kind, r.status, str(r.config.get("model", "-")),
                  str(what), r.environment.get("gpu", {}).get("name") or r.environment.get("device"),
                  fmt(getattr(m, "tokens_per_s", None)), fmt(getattr(m, "peak_mem_allocated_bytes", None), ".2f", GIB,
                                                             " GiB"), ",".join(r.tags))
    return t


def print_table(table: Table, console: Console | None = None) -> None:
    console = console or Console()
    if not console.is_terminal:  # piped output: do not squeeze columns into 80 characters
        console.width = 200
    console.print(table)


def compare_table(records: list[ResultRecord], title: str = "comparison") -> Table:
    """Runs side by side, with throughput and memory relative to the first (the baseline)."""
    t = Table(title=title)
    for col in ("run", "status", "tokens/s", "samples/s", "step p50 ms", "peak memory", "MFU", "vs first"):
        t.add_column(col)
    base = records[0].metrics.tokens_per_s if records else None
    for r in records:
        c, m = r.config, r.metrics
        speed = f"{m.tokens_per_s / base:.2f}x" if base and m.tokens_per_s else "-"
        mem = m.peak_mem_allocated_bytes if m.peak_mem_allocated_bytes is not None else m.peak_rss_bytes
        label = "peak alloc" if m.peak_mem_allocated_bytes is not None else "peak RSS"
        t.add_row(f"{c['model']} {c['method']} b{c['batch_size']} s{c['seq_len']}", r.status, fmt(m.tokens_per_s),
                  fmt(m.samples_per_s, ",.2f"), "-" if not m.step_time_s else f"{m.step_time_s.p50 * 1e3:.1f}",
                  f"{fmt(mem, '.2f', GIB, ' GiB')} ({label})", "-" if m.mfu is None else f"{m.mfu:.1%}", speed)
    return t


def scaling_table(records: list[ResultRecord]) -> Table:
    """Speedup and scaling efficiency (tokens/s(N) / (N x tokens/s(1))) per world size."""
    c = records[0].config if records else {}
    t = Table(title=f"scaling: {c.get('model')} {c.get('method')} {c.get('strategy')}, batch {c.get('batch_size')} "
                    f"x accum {c.get('grad_accum')} x seq {c.get('seq_len')} per GPU")
    for col in ("world size", "status", "tokens/s", "per GPU", "step p50 ms", "peak alloc", "MFU", "speedup",
                "efficiency"):
        t.add_column(col)
    for r in records:
        m, s = r.metrics, r.metrics.scaling or {}
        t.add_row(str(m.world_size), r.status, fmt(m.tokens_per_s), fmt(m.tokens_per_s_per_gpu),
                  "-" if not m.step_time_s else f"{m.step_time_s.p50 * 1e3:.1f}",
                  fmt(m.peak_mem_allocated_bytes, ".2f", GIB, " GiB"), "-" if m.mfu is None else f"{m.mfu:.1%}",
                  "-" if "speedup" not in s else f"{s['speedup']:.2f}x",
                  "-" if "efficiency" not in s else f"{s['efficiency']:.1%}")
    return t


def sweep_table(title: str, entries: list, records: list[ResultRecord], cv_limit: float = 0.02) -> Table:
    """One row per configuration: statuses of its attempts, mean/std/CV of tokens/s, memory, vs the first."""
    import statistics

    t = Table(title=title)
    for col in ("#", "configuration", "status", "tokens/s mean", "std", "CV", "samples/s", "peak alloc", "MFU",
                "vs first"):
        t.add_column(col)
    base = None
    for i, e in enumerate(entries, 1):
        mine = [r for r in records if r.config_hash == e.config.config_hash()]
        ok = [r.metrics for r in mine if r.status == "ok" and r.metrics.tokens_per_s]
        statuses = ", ".join(sorted({r.status for r in mine})) or "not run"
        if not ok:
            t.add_row(str(i), e.name, statuses, "-", "-", "-", "-", "-", "-", "-")
            continue
        tps = [m.tokens_per_s for m in ok]
        mean = statistics.fmean(tps)
        std = statistics.stdev(tps) if len(tps) > 1 else None
        cv = std / mean if std is not None else None
        base = base or mean
        cv_text = "-" if cv is None else f"{cv:.1%}" + (" (!)" if cv > cv_limit else "")
        mem = max((m.peak_mem_allocated_bytes or 0) for m in ok) or None
        mfu = [m.mfu for m in ok if m.mfu is not None]
        t.add_row(str(i), e.name, f"{statuses} ({len(ok)}/{len(mine)} ok)", fmt(mean), fmt(std), cv_text,
                  fmt(statistics.fmean(m.samples_per_s for m in ok), ",.3f"), fmt(mem, ".2f", GIB, " GiB"),
                  "-" if not mfu else f"{statistics.fmean(mfu):.1%}", f"{mean / base:.2f}x")
    return t
