"""One way to write a figure and one way to name a run, for every table, report and file."""

from __future__ import annotations

import re
from typing import Any

from tunebench.record import ResultRecord, StepTimes
from tunebench.units import GIB


def kept_label(ckpt_keep: str | None, every: int) -> str:
    """What checkpointed blocks keep, for a run's name: '+mm' (matmuls), '+mm/4' (in one block of 4), or ''."""
    if ckpt_keep != "matmuls":
        return ""
    return "+mm" + (f"/{every}" if every > 1 else "")


def fmt(v: float | int | None, spec: str = ",.1f", scale: float = 1.0, unit: str = "") -> str:
    """A number for a table: '-' when it was not measured."""
    return "-" if v is None else f"{v / scale:{spec}}{unit}"


def gib(v: float | int | None, spec: str = ".2f", unit: str = " GiB") -> str:
    return fmt(v, spec, GIB, unit)


def pct(v: float | None, spec: str = ".1%") -> str:
    return "-" if v is None else f"{v:{spec}}"


def duration(seconds: float) -> str:
    """A span of time as a person reads it: '40 s', '12 min', '3.4 h', '9 days', '31 years'."""
    for unit, size, limit, spec in (("s", 1, 90, ".0f"), ("min", 60, 90, ".0f"), ("h", 3600, 48, ".1f"),
                                    ("days", 86400, 730, ".0f")):
        if seconds < size * limit:
            return f"{seconds / size:{spec}} {unit}"
    return f"{seconds / (365.25 * 86400):,.0f} years"


def step_times(st: StepTimes | None) -> str:
    """p50 / p90 / p99 in milliseconds."""
    return "-" if not st else f"{st.p50 * 1e3:.1f} / {st.p90 * 1e3:.1f} / {st.p99 * 1e3:.1f} ms"


def p50_ms(st: StepTimes | None) -> str:
    return "-" if not st else f"{st.p50 * 1e3:.1f}"


EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Unsupported)(:|$)")


def first_line(text: str | None, limit: int = 80, last: bool = False) -> str:
    """The first line of `text`; `last`: its last, or for a traceback the line naming the exception (see
    `headline`)."""
    lines = (text or "").strip().splitlines()
    return (headline(text) if last else lines[0])[:limit] if lines else ""


def headline(error: str | None) -> str:
    """The line of an error that says what went wrong: the last line naming an exception (a traceback's own
    line; below it can come hints such as torch.compile's "Set TORCHDYNAMO_VERBOSE=1 ..."), else the last line."""
    lines = [line for line in (error or "").strip().splitlines() if line.strip()]
    named = [line for line in lines if EXCEPTION_LINE.match(line)]
    return (named or lines or [""])[-1]


def error_cell(rec: ResultRecord, limit: int = 80, last: bool = False) -> str:
    """The error of a failed run, shortened for a table cell ('' when it is ok)."""
    return first_line(rec.error, limit, last) if rec.status != "ok" else ""


def compiled(m: Any) -> str:
    """How the run was compiled and what compiling took (within setup, never in the step times)."""
    if not m.compile_scope:
        return "eager"
    return f"compiled per {'block' if m.compile_scope == 'blocks' else 'model'}" + (
        ", CUDA graphs" if m.cuda_graphs else "") + (
        f" in {m.compile_s:.1f} s" if m.compile_s is not None else "")


def per_device(rec: ResultRecord) -> str:
    """What a run's devices are called: GPU on GPUs, process on the CPU."""
    return "GPU" if rec.environment.get("device") == "cuda" else "process"


def config_label(c: dict[str, Any], kind: str = "train", world_size: int | None = None,
                 compiled: str | None = None) -> str:
    """A run's name from its config: model, method, strategy, world size, batch x accumulation, sequence;
    `compiled`: what a run compiled as (a record knows; a config with compile=auto does not say)."""
    if kind == "infer":
        return (f"infer {c['model']} {c['precision']} b{c['batch_size']} p{c['prompt_len']}+{c['new_tokens']} "
                f"{c['kv_cache']}" + (" compile" if c.get("compile") else ""))
    if kind == "load":
        return f"load {c['model']} {c['precision']}"
    if kind == "hw":
        return "hw " + ",".join(c.get("sections", []))
    world = f" x{world_size}" if world_size else ""
    every = c.get("ckpt_every", 1)
    keep = kept_label(c.get("ckpt_keep"), c.get("ckpt_keep_every", 1))
    extras = (" ckpt" + (f"/{every}" if every > 1 else "") + keep) * bool(c.get("grad_ckpt"))
    extras += " compile" * (c.get("compile") is True if compiled is None else bool(compiled))
    extras += " tf32" * bool(c.get("tf32"))
    objective = c.get("objective", "sft")
    extras += f" {objective}" * (objective != "sft") + " precomputed" * bool(c.get("precompute_reference"))
    return (f"{c['model']} {c['method']} {c.get('strategy', 'single')}{world} "
            f"b{c['batch_size']}x{c.get('grad_accum', 1)} s{c['seq_len']}{extras}")


def label(rec: ResultRecord, names: dict[str, str] | None = None) -> str:
    """The one label of a run: its sweep entry's name when it has one, else its configuration."""
    if names and rec.config_hash in names:
        return names[rec.config_hash]
    ran = (getattr(rec.metrics, "compile_scope", None) or "") if rec.config.get("compile") == "auto" else None
    return config_label(rec.config, rec.kind, getattr(rec.metrics, "world_size", None), ran)


def peak_memory(m: Any) -> str:
    """A run's peak memory: the GPU's allocated peak, or on the CPU the process's peak resident set (RSS)."""
    alloc = getattr(m, "peak_mem_allocated_bytes", None)
    if alloc:
        return gib(alloc)
    rss = getattr(m, "peak_rss_bytes", None)
    return f"{gib(rss)} RSS" if rss else "-"
