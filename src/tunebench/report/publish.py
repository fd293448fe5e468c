"""One Markdown file per configuration, in the style of torchtitan's benchmarks/ folder."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tunebench.files import write_text
from tunebench.format import compiled, fmt, gib, headline, label, pct, per_device, step_times
from tunebench.record import ResultRecord


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "run"


def _hardware(rec: ResultRecord) -> list[str]:
    env, m = rec.environment, rec.metrics
    gpu = env.get("gpu", {})
    if not gpu.get("name"):
        return [f"- no GPU: {m.world_size} process(es) on the CPU ({m.nnodes} node(s))"]
    return [f"- GPU: {gpu['name']} × {m.world_size} ({m.nnodes} node(s)), {gib(gpu.get('memory_bytes'), '.0f')} "
            f"each, compute capability {gpu.get('capability')}",
            f"- driver {env.get('driver')}, CUDA {env.get('cuda')}"]


def publish(rec: ResultRecord, out: Path, name: str | None = None) -> Path:
    c, m, env = rec.config, rec.metrics, rec.environment
    title = name or label(rec)
    figures = [
        ("status", rec.status), ("tokens/s (global)", fmt(m.tokens_per_s)),
        (f"tokens/s per {per_device(rec)}", fmt(m.tokens_per_s_per_gpu)), ("samples/s", fmt(m.samples_per_s, ",.3f")),
        ("step time p50 / p90 / p99", step_times(m.step_time_s)),
        ("peak memory allocated / reserved", f"{gib(m.peak_mem_allocated_bytes)} / {gib(m.peak_mem_reserved_bytes)}"),
        ("MFU / HFU", f"{pct(m.mfu)} / {pct(m.hfu)}"),
        ("MFU, full-attention FLOPs (PaLM, torchtitan)", pct(m.mfu_noncausal)),
        ("FLOPs per token", m.flops_formula or "-"),
        ("timed steps / warmup", f"{m.timed_steps} / {c.get('warmup')}"),
        ("setup", "-" if m.setup_s is None else f"{m.setup_s:.1f} s ({compiled(m)})"),
        ("loss first / last", f"{m.loss_first} / {m.loss_last}"),
    ]
    if m.scaling:
        figures.append(("scaling", f"speedup {m.scaling.speedup:.2f}x, efficiency {pct(m.scaling.efficiency)}"))
    versions, tb = env.get("versions", {}), env.get("tunebench", {})
    text = "\n".join([
        f"# {title}", "", f"Result `{rec.id}`, {rec.created_at}." + (f" Error: `{headline(rec.error)}`"
                                                                        if rec.error else ""), "",
        "## Figures", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in figures], "",
        "## Hardware", "",
        *_hardware(rec),
        f"- CPU: {env.get('cpu', {}).get('model')} ({env.get('cpu', {}).get('cores')} cores), "
        f"host {env.get('host', {}).get('hostname')}", "",
        "## Software", "", *[f"- {k} {v}" for k, v in versions.items() if v],
        f"- tunebench {tb.get('version')} (commit {tb.get('git_commit')})", "",
        "## Configuration", "", "```yaml", yaml.safe_dump(c, sort_keys=False).strip(), "```", "",
        "Reproduce: save the configuration above as `run.yaml`, then `tunebench run run.yaml`.", ""])
    path = out / f"{slug(title)}-{rec.id[:8]}.md"
    return write_text(path, text)
