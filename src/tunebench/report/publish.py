"""One Markdown file per configuration, in the style of torchtitan's benchmarks/ folder."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tunebench.record import ResultRecord
from tunebench.report.summary import fmt

GIB = 1024**3


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "run"


def publish(rec: ResultRecord, out: Path, name: str | None = None) -> Path:
    c, m, env = rec.config, rec.metrics, rec.environment
    gpu = env.get("gpu", {})
    title = name or f"{c['model']} {c['method']} {c.get('strategy', 'single')} x{m.world_size}"
    st = m.step_time_s
    figures = [
        ("status", rec.status), ("tokens/s (global)", f"{m.tokens_per_s:,.1f}" if m.tokens_per_s else "-"),
        ("tokens/s per GPU", f"{m.tokens_per_s_per_gpu:,.1f}" if m.tokens_per_s_per_gpu else "-"),
        ("samples/s", f"{m.samples_per_s:,.3f}" if m.samples_per_s else "-"),
        ("step time p50 / p90 / p99", "-" if not st else f"{st.p50 * 1e3:.1f} / {st.p90 * 1e3:.1f} / {st.p99 * 1e3:.1f} ms"),
        ("peak memory allocated / reserved",
         f"{fmt(m.peak_mem_allocated_bytes, '.2f', GIB)} / {fmt(m.peak_mem_reserved_bytes, '.2f', GIB)} GiB"),
        ("MFU / HFU", f"{fmt(m.mfu, '.1%')} / {fmt(m.hfu, '.1%')}"),
        ("FLOPs per token", m.flops_formula or "-"),
        ("timed steps / warmup", f"{m.timed_steps} / {c.get('warmup')}"),
        ("setup", "-" if m.setup_s is None else f"{m.setup_s:.1f} s"),
        ("loss first / last", f"{m.loss_first} / {m.loss_last}"),
    ]
    if m.scaling:
        figures.append(("scaling", f"speedup {m.scaling['speedup']:.2f}x, efficiency {m.scaling['efficiency']:.1%}"))
    versions = env.get("versions", {})
    text = "\n".join([
        f"# {title}", "", f"Result `{rec.id}`, {rec.created_at}." + (f" Error: `{rec.error.splitlines()[-1]}`"
                                                                        if rec.error else ""), "",
        "## Figures", "", "| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in figures], "",
        "## Hardware", "",
        f"- GPU: {gpu.get('name') or 'none (CPU)'} × {m.world_size} ({m.nnodes} node(s)), "
        f"{(gpu.get('memory_bytes') or 0) / GIB:.0f} GiB each, compute capability {gpu.get('capability')}",
        f"- driver {env.get('driver')}, CUDA {env.get('cuda')}",
        f"- CPU: {env.get('cpu', {}).get('model')} ({env.get('cpu', {}).get('cores')} cores), "
        f"host {env.get('host', {}).get('hostname')}", "",
        "## Software", "", *[f"- {k} {v}" for k, v in versions.items() if v],
        f"- tunebench {env.get('tunebench', {}).get('version')} (commit {env.get('tunebench', {}).get('git_commit')})", "",
        "## Configuration", "", "```yaml", yaml.safe_dump(c, sort_keys=False).strip(), "```", "",
        "Reproduce: save the configuration above as `run.yaml`, then `tunebench run run.yaml`.", ""])
    path = out / f"{slug(title)}-{rec.id[:8]}.md"
    path.write_text(text)
    return path
