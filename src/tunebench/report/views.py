"""What the terminal shows about training results, as document tables (tunebench.console prints them)."""

from __future__ import annotations

import statistics

from tunebench.document import Table
from tunebench.format import compiled, config_label, first_line, fmt, gib, label, p50_ms, pct, peak_memory, step_times
from tunebench.record import ResultRecord
from tunebench.report.context import CV_LIMIT


def run_table(rec: ResultRecord) -> Table:
    c, m = rec.config, rec.metrics
    gpu = rec.environment.get("gpu", {}).get("name") or rec.environment.get("device", "cpu")
    t = Table(["", ""], title=f"tunebench run {rec.id[:12]}  status: {rec.status}", show_header=False)
    precision = m.precision or c["precision"]
    if c["precision"] == "auto" and m.precision:
        precision += " (auto)"
    if c.get("tf32"):
        precision += ", TF32 matmuls"
    objective = c.get("objective", "sft")
    pairs = objective != "sft"
    t.add("workload", f"{c['model']} {c['method']}" + f" {objective}" * pairs + f" {precision}  batch "
                      f"{c['batch_size']}{' pairs' * pairs} x accum {c['grad_accum']} x seq {c['seq_len']}  opt "
                      f"{c['optimizer']}  ckpt {c['grad_ckpt']}")
    t.add("device", f"{gpu} x {m.world_size}" + (f" on {m.nnodes} nodes" if m.nnodes > 1 else "")
          + f"  strategy {c.get('strategy', 'single')}")
    t.add("tokens/s", f"{fmt(m.tokens_per_s)}  ({fmt(m.tokens_per_s_per_gpu)} per device)")
    t.add("pairs/s" if pairs else "samples/s", fmt(m.samples_per_s, ",.3f"))
    t.add("step time p50/p90/p99", "-" if not m.step_time_s else
          f"{step_times(m.step_time_s)}  (mean {m.step_time_s.mean * 1e3:.1f}, std {m.step_time_s.std * 1e3:.1f})")
    t.add("peak memory alloc/reserved", f"{gib(m.peak_mem_allocated_bytes)} / {gib(m.peak_mem_reserved_bytes)}"
                                        f"  (NVML used {gib(m.nvml_mem_used_bytes)})")
    t.add("peak host RSS", gib(m.peak_rss_bytes))
    t.add("MFU / HFU", "-" if m.mfu is None else f"{pct(m.mfu)} / {pct(m.hfu)}" + (
        f"  (MFU with full-attention FLOPs, as PaLM and torchtitan count: {pct(m.mfu_noncausal)})"
        if m.mfu_noncausal is not None else ""))
    t.add("FLOPs/token", fmt(m.flops_per_token, ".3e"))
    t.add("params trainable/total", f"{fmt(m.params_trainable, ',.0f')} / {fmt(m.params_total, ',.0f')}")
    t.add("setup", fmt(m.setup_s, ".1f", unit=" s") + f"  (weights: {m.weights or '-'}; {compiled(m)})")
    t.add("loss first/last", f"{fmt(m.loss_first, '.4f')} / {fmt(m.loss_last, '.4f')}")
    if (tel := m.telemetry):
        t.add("GPU telemetry", f"util {tel.gpu_util_mean_pct:.0f}%, power {tel.power_mean_w:.0f} W, energy "
                               f"{fmt(m.energy_j_per_token, '.4f')} J/token, max {tel.temperature_max_c} C, SM clock "
                               f"min {tel.sm_clock_min_mhz} MHz, throttle: {', '.join(tel.throttle_reasons) or 'none'}")
    if m.step_time_skew is not None and m.world_size > 1:
        t.add("rank step-time skew", pct(m.step_time_skew))
    if m.scaling:
        t.add("scaling", f"speedup {m.scaling.speedup:.2f}x, efficiency {pct(m.scaling.efficiency)} "
                         f"vs world size {m.scaling.baseline_world_size}")
    if rec.error:
        t.add("error", first_line(rec.error, 300, last=True))
    return t


def list_table(records: list[ResultRecord]) -> Table:
    t = Table(["id", "created", "kind", "status", "model", "method / what", "device", "tokens/s", "peak memory",
               "tags"], title=f"{len(records)} results")
    for r in records:
        m = r.metrics
        what = r.config.get("method") or r.config.get("precision") or ",".join(r.config.get("sections", []))
        if r.kind == "eval":  # the task and its score: what an evaluation is
            what = f"{m.role} {m.task} {m.metric} {fmt(m.value, '.4f')}"
        t.add(r.id[:12], r.created_at.replace("+00:00", "Z"), r.kind, r.status, str(r.config.get("model", "-")),
              str(what), r.environment.get("gpu", {}).get("name") or r.environment.get("device"),
              fmt(getattr(m, "tokens_per_s", None)), peak_memory(m), ",".join(r.tags))
    return t


def compare_table(records: list[ResultRecord], title: str = "comparison") -> Table:
    """Runs side by side, with throughput and memory relative to the first (the baseline)."""
    t = Table(["run", "status", "tokens/s", "samples/s", "step p50 ms", "peak memory", "MFU", "vs first"], title=title)
    base = records[0].metrics.tokens_per_s if records else None
    for r in records:
        m = r.metrics
        speed = f"{m.tokens_per_s / base:.2f}x" if base and m.tokens_per_s else "-"
        on_gpu = m.peak_mem_allocated_bytes is not None
        mem = m.peak_mem_allocated_bytes if on_gpu else m.peak_rss_bytes
        t.add(label(r), r.status, fmt(m.tokens_per_s), fmt(m.samples_per_s, ",.2f"), p50_ms(m.step_time_s),
              f"{gib(mem)} ({'peak alloc' if on_gpu else 'peak RSS'})", pct(m.mfu), speed)
    return t


def scaling_table(records: list[ResultRecord]) -> Table:
    """Speedup and scaling efficiency (tokens/s(N) / (N x tokens/s(1))) per world size."""
    c = records[0].config if records else {}
    t = Table(["world size", "status", "tokens/s", "per device", "step p50 ms", "peak alloc", "MFU", "speedup",
               "efficiency"], title=f"scaling: {c.get('model')} {c.get('method')} {c.get('strategy')}, batch "
                                    f"{c.get('batch_size')} x accum {c.get('grad_accum')} x seq {c.get('seq_len')} "
                                    "per device")
    for r in records:
        m, s = r.metrics, r.metrics.scaling
        t.add(str(m.world_size), r.status, fmt(m.tokens_per_s), fmt(m.tokens_per_s_per_gpu), p50_ms(m.step_time_s),
              gib(m.peak_mem_allocated_bytes), pct(m.mfu), "-" if not s else f"{s.speedup:.2f}x",
              "-" if not s else pct(s.efficiency))
    return t


def sweep_plan_table(name: str, entries: list, repeats: int, refused: dict[str, str] | None = None) -> Table:
    """A sweep's expanded configurations before anything runs (--dry-run), each with its check on this machine."""
    t = Table(["#", "name", "model", "method", "strategy", "batch x accum x seq", "precision", "optimizer", "hash",
               "check"], title=f"suite {name}: {len(entries)} configurations x {repeats} repeats")
    for i, e in enumerate(entries, 1):
        c = e.config
        t.add(str(i), e.name, c.model, c.method, c.strategy, f"{c.batch_size} x {c.grad_accum} x {c.seq_len}",
              c.precision, c.optimizer, c.config_hash(), "refused: " + refused[e.name] if e.name in (refused or {})
              else "ok")
    return t


def sweep_table(title: str, entries: list, records: list[ResultRecord]) -> Table:
    """One row per configuration: statuses of its attempts, mean/std/CV of tokens/s, memory, vs the first."""
    t = Table(["#", "configuration", "status", "tokens/s mean", "std", "CV", "samples/s", "peak alloc", "MFU",
               "vs first"], title=title)
    base = None
    for i, e in enumerate(entries, 1):
        mine = [r for r in records if r.config_hash == e.config.config_hash()]
        ok = [r.metrics for r in mine if r.status == "ok" and r.metrics.tokens_per_s]
        statuses = ", ".join(sorted({r.status for r in mine})) or "not run"
        if not ok:
            t.add(str(i), e.name, statuses, *["-"] * 7)
            continue
        tps = [m.tokens_per_s for m in ok]
        mean = statistics.fmean(tps)
        std = statistics.stdev(tps) if len(tps) > 1 else None
        cv = std / mean if std is not None else None
        base = base or mean
        mfu = [m.mfu for m in ok if m.mfu is not None]
        t.add(str(i), e.name, f"{statuses} ({len(ok)}/{len(mine)} ok)", fmt(mean), fmt(std),
              "-" if cv is None else pct(cv) + (" (!)" if cv > CV_LIMIT else ""),
              fmt(statistics.fmean(m.samples_per_s for m in ok), ",.3f"),
              gib(max((m.peak_mem_allocated_bytes or 0) for m in ok) or None),
              "-" if not mfu else pct(statistics.fmean(mfu)), f"{mean / base:.2f}x")
    return t


def attempt_summary(rec: ResultRecord) -> str:
    """A sweep attempt in a few words: its status and throughput."""
    tps = getattr(rec.metrics, "tokens_per_s", None)
    return rec.status + (f", {tps:,.0f} tokens/s" if tps else "")


def describe(cfg) -> str:
    """A configuration about to run, for progress lines."""
    return config_label(cfg.model_dump())


def cost_table(rec: ResultRecord, costs: list, samples: int) -> Table:
    """One result's cost on every matching offering, on demand and spot (report.cost.Cost rows)."""
    gpu = rec.environment.get("gpu", {}).get("name")
    t = Table(["offering", "pricing", "$/hour", "$/1K samples", "$/1M tokens", "tokens per $", "job time", "job cost",
               "source"], title=f"{rec.id[:12]}: {rec.config['model']} {rec.config['method']} on "
                                f"{rec.metrics.world_size} x {gpu}, {rec.metrics.samples_per_s:,.3f} samples/s, job of "
                                f"{samples:,} samples")
    for c in costs:
        o = c.offering
        t.add(o.provider, "spot" if c.spot else "on-demand", f"${c.dollars_per_hour:.2f}", f"${c.per_1k_samples:.4f}",
              f"${c.per_1m_tokens:.3f}", f"{c.tokens_per_dollar:,.0f}", f"{c.job_hours:.2f} h", f"${c.job_cost:.2f}",
              f"{o.source} ({o.date})")
    return t


def comparison_table(rows: list, a: str, b: str, threshold: float) -> Table:
    """B against A configuration by configuration (report.compare.Row rows)."""
    t = Table(["configuration", "tokens/s B/A", "peak memory B/A", "MFU B/A", "flags"],
              title=f"B = {b} against A = {a} (threshold {threshold:.0%})")
    for r in rows:
        t.add(r.name, *("-" if v is None else f"{v:.3f}" for v in r.ratios.values()),
              ("REGRESSION: " if r.regression else "") + ", ".join(r.flags))
    return t
