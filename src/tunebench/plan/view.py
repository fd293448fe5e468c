"""Tables of a prediction: the verdict and figures, the memory item by item, the step's time by kind."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tunebench.choices import compile_scope
from tunebench.document import Table
from tunebench.format import config_label, fmt, gib, pct
from tunebench.plan import Prediction
from tunebench.strategies import STRATEGIES


def summary_table(p: Prediction) -> Table:
    c, m, t = p.cfg, p.mem, p.time
    title = f"tunebench plan: {config_label(c.model_dump(), world_size=p.world)} on {p.hw.gpu.name}"
    tab = Table(["", ""], title=title, show_header=False)
    tab.add("verdict", f"{p.verdict}: needs {gib(m.total)} of {gib(p.hw.gpu.memory_bytes)} per GPU "
                       f"({pct(m.total / p.hw.gpu.memory_bytes)})")
    phases = ", ".join(f"{name} {gib(b)}" for name, b in m.phases.items())
    tab.add("peak allocated", f"{gib(m.peak_allocated)} per GPU, in the {m.peak_phase}  ({phases})")
    beyond = f"allocator reserve {gib(m.reserve_bytes)}, CUDA context {gib(m.context_bytes)}"
    if m.paged_bytes:
        beyond += f", paged optimizer state {gib(m.paged_bytes)}"
    tab.add("beyond the peak", beyond)
    if m.host_bytes:
        per_node = p.world // max(1, p.cfg.nnodes)
        what = ("the blocks' saved activations, pinned" if p.cfg.offload == "activations" else
                "the offloaded fp32 master weights, Adam's state and gradients")
        tab.add("host memory", f"{gib(m.host_bytes * per_node)} per node ({gib(m.host_bytes)} per GPU's process): "
                               + what)
    if p.workload is not None:
        tab.add("model", model_line(p.workload))
    tab.add("tokens/s", f"{fmt(p.tokens_per_s, ',.0f')}  ({fmt(p.tokens_per_s / p.world, ',.0f')} per GPU)")
    tab.add("step time", f"{t.seconds * 1e3:,.1f} ms  ({t.bound}-bound)")
    tab.add("MFU", pct(p.mfu))
    tab.add("hardware figures", p.hw.source)
    whole = compile_scope(p.cfg, STRATEGIES[p.cfg.strategy]) == "model"
    if whole:
        tab.add("note", "the whole model compiled as one graph: its memory and host time fitted on GPT-2 and "
                        "Llama-3.2-1B runs" + ("; replayed as CUDA graphs: their host time and pools fitted on GPT-2 "
                                               "small" if p.cfg.cuda_graphs is True else ""))
    if p.cfg.precision == "fp32":
        tab.add("note", ("fp32 with tf32: matmuls on the tensor cores in TF32, at the TF32 matmul ceiling"
                         if p.cfg.tf32 else "fp32: matmuls on the CUDA cores (tf32 false, PyTorch's default), at the "
                         "fp32 matmul ceiling") + "; attention and elementwise work fitted on GPT-2 small and "
                        "Llama-3.2-1B")
    if p.cfg.float8 != "off":
        kept = ("the blocks keep float8 copies of their matmuls' inputs (counted)" if p.cfg.method == "full" else
                "a frozen float8 base's memory is predicted as bf16's, an upper bound")
        tab.add("note", f"float8={p.cfg.float8}: {kept}; speed fitted on float8 runs")
    if p.cfg.method == "qlora" and STRATEGIES[p.cfg.strategy].gathers_per_module:
        tab.add("note", "QLoRA under zero3: memory is not modelled (DeepSpeed's gathering of the packed 4-bit "
                        "base holds more: benchmarks/results/planner.md); its speed is host-bound by DeepSpeed's "
                        "hooks on the adapted layers (fitted); fsdp shards QLoRA at ddp's speed")
    if p.cfg.offload == "optimizer":
        tab.add("note", "offload=optimizer: the host's step (CPU Adam, PCIe copies) is counted as GPU-side optimizer "
                        "time, from one measured run")
    if p.cfg.offload == "activations":
        tab.add("note", "offload=activations: the copies to the host and back are taken as hidden behind the step's "
                        "compute where they take less time; beyond it they are exposed")
    w = p.workload
    if w is not None and w.experts:
        tab.add("note", "mixture of experts: its grouped GEMMs' efficiency fitted on two models (Qwen3-30B-A3B, "
                        "Mixtral-8x7B)")
    if p.verdict == "tight":
        tab.add("note", "within 5% of the GPU's memory, or fitting only with the allocator's cache trimmed: "
                        "fragmentation may still run out; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces it")
    return tab


def model_line(w: Any) -> str:
    """The family and its parameters; a mixture of experts' active ones (its routers and k experts) apart."""
    c, label = w.counts, w.arch.label if w.arch else w.family
    line = f"{label}: {c.total / 1e9:,.2f} B parameters"
    if w.experts:
        line += (f", {(c.matmul + c.embeddings) / 1e9:,.2f} B active per token ({w.experts.active} of "
                 f"{w.experts.count} experts; experts {c.experts / 1e9:,.2f} B, routers {c.routers / 1e6:,.1f} M)")
    return line


def memory_table(p: Prediction) -> Table:
    m = p.mem
    tab = Table(["memory per GPU", "GiB", "what"], title="memory breakdown")
    for item in m.items:
        tab.add(item.name, gib(item.bytes, unit=""), item.note)
    a = m.activations
    tab.add("  per block", gib(a.kept_per_layer * p.cfg.rows_per_micro * p.cfg.seq_len, ".3f", ""),
            f"{fmt(a.kept_per_layer, ',.0f')} bytes/token kept ({fmt(a.traced_backward or a.per_layer, ',.0f')} "
            "during its backward), "
            f"{a.attention} attention")
    if a.routing:
        tab.add("  routing", gib(a.routing * p.cfg.rows_per_micro * p.cfg.seq_len, ".3f", ""),
                f"of each sparse block's: {fmt(a.routing, ',.0f')} bytes/token (the router's probabilities, the "
                "chosen experts' indices)")
    return tab


def time_table(p: Prediction) -> Table:
    """GPU work by kind (shares of it); the host's work runs beside it, the exposed network after it."""
    tab = Table(["step time", "ms", "share"], title=f"where the step's time goes ({p.time.bound}-bound)")
    parts = dict(p.time.parts)
    host, network = parts.pop("host"), parts.pop("network (exposed)")
    gpu = sum(parts.values()) or 1.0
    for kind, seconds in parts.items():
        tab.add(f"GPU: {kind}", fmt(seconds * 1e3, ",.1f"), pct(seconds / gpu))
    tab.add("GPU work", fmt(gpu * 1e3, ",.1f"), "")
    tab.add("host (beside the GPU)", fmt(host * 1e3, ",.1f"), "")
    tab.add("network (not hidden)", fmt(network * 1e3, ",.1f"), "")
    tab.add("step", fmt(p.time.seconds * 1e3, ",.1f"), "")
    return tab


def compare_table(rows: Sequence[Any]) -> Table:
    """rows: api.plan.Row (strategy, world, prediction or refusal)."""
    tab = Table(["strategy", "GPUs", "peak alloc/GPU", "needs/GPU", "verdict", "step ms", "tokens/s",
                 "tokens/s/GPU", "MFU", "bound or why refused"], title="strategies and world sizes")
    for r in rows:
        p = r.prediction
        if p is None:
            tab.add(r.strategy, str(r.world), "-", "-", "refused", "-", "-", "-", "-", r.refused or "")
            continue
        tab.add(r.strategy, str(r.world), gib(p.mem.peak_allocated), gib(p.mem.total), p.verdict,
                fmt(p.time.seconds * 1e3, ",.1f"), fmt(p.tokens_per_s, ",.0f"),
                fmt(p.tokens_per_s / p.world, ",.0f"), pct(p.mfu), p.time.bound)
    return tab


def calibration_tables() -> list[Table]:
    """The planner's fitted constants (plan.calibration) and each strategy's own (its registry row)."""
    from dataclasses import fields

    from tunebench.plan.calibration import rows

    tab = Table(["constant", "value", "unit", "fitted on"], title="the planner's calibration (plan/calibration.py)")
    for name, value, unit, fitted_on in rows():
        tab.add(name, str(value), unit, fitted_on)
    # a fact a row, a strategy a column: the facts outnumber the strategies and would squeeze their names
    per = Table(["fact", *STRATEGIES], title="each strategy's planner facts (strategies/__init__.py)")
    for f in fields(next(iter(STRATEGIES.values())).planner):
        per.add(f.name, *(str(getattr(st.planner, f.name)) for st in STRATEGIES.values()))
    return [tab, per]
