"""`tunebench plan`: a configuration's memory and speed on a GPU, predicted before anything runs.

    workload(cfg, world)      what the configuration asks of each GPU (counts, dtypes), no torch
    memory(workload)          peak allocated bytes by item and phase; context and allocator reserve
    step_time(workload, hw)   seconds per step from FLOPs, bytes moved, host time and collectives
    predict(cfg, gpu, world)  both, and the verdict against the GPU's memory (evaluates: a train job's evaluations)

A prediction carries the record's own metric names (peak_mem_allocated_bytes, tokens_per_s,
step_time_s), so a run stores it beside what it measured and a report compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunebench.config import RunConfig
from tunebench.gpus import Gpu
from tunebench.plan.hardware import Hardware, hardware
from tunebench.plan.memory import MemoryPlan, memory
from tunebench.plan.speed import StepTime, step_time
from tunebench.plan.workload import Workload, workload

TIGHT = 0.95  # above this share of the GPU's memory a configuration may fail on fragmentation


@dataclass(frozen=True)
class Prediction:
    cfg: RunConfig
    world: int
    hw: Hardware
    mem: MemoryPlan
    time: StepTime
    flops_per_token: float  # model FLOPs per token, as runs define MFU
    workload: Workload | None = None  # what it was predicted for (counts, family)

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.rows_per_micro * self.cfg.seq_len * self.cfg.grad_accum * self.world

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.time.seconds

    @property
    def mfu(self) -> float:
        return self.flops_per_token * self.tokens_per_s / self.world / self.hw.gpu.peak_flops

    @property
    def verdict(self) -> str:
        used, least = (m / self.hw.gpu.memory_bytes for m in (self.mem.total, self.mem.least))
        return "fits" if used <= TIGHT else ("tight" if used <= 1.0 or least <= 1.0 else "does not fit")

    @property
    def fits(self) -> bool:
        return self.verdict != "does not fit"

    def as_dict(self) -> dict[str, Any]:
        """The prediction under the record's metric names, with its breakdown beside them."""
        m = self.mem
        return {
            "gpu": self.hw.gpu.name, "world_size": self.world, "hardware": self.hw.source,
            "peak_mem_allocated_bytes": int(m.peak_allocated), "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_gpu": self.tokens_per_s / self.world, "step_time_s": self.time.seconds,
            "mfu": self.mfu, "memory_needed_bytes": int(m.total), "gpu_memory_bytes": self.hw.gpu.memory_bytes,
            "verdict": self.verdict, "fits": self.fits,
            "params_total": self.workload.counts.total if self.workload else None,
            "params_active": (self.workload.counts.matmul + self.workload.counts.embeddings) if self.workload else None,
            "breakdown": {
                "memory": [{"name": i.name, "bytes": int(i.bytes), "note": i.note} for i in m.items],
                "peak_phase": m.peak_phase, "phases": {k: int(v) for k, v in m.phases.items()},
                "context_bytes": int(m.context_bytes), "reserve_bytes": int(m.reserve_bytes),
                "paged_bytes": int(m.paged_bytes), "host_bytes": int(m.host_bytes),
                "activations_per_token_per_layer": int(m.activations.per_layer),
                "kept_per_token_per_layer": int(m.activations.kept_per_layer),
                "attention_kernel": m.activations.attention,
                "time_s": self.time.parts, "bound": self.time.bound,
            },
        }


def model_flops_per_token(w: Workload) -> float:
    """MFU's numerator without building the model: 6 N_trainable + 4 N_frozen (matmuls) + 6 L H hd S."""
    c, s = w.counts, w.spec
    matmul = c.matmul  # an MoE's active weights: its routers and k experts
    attention = 6.0 * w.layers * s.num_heads * s.head_dim * w.cfg.seq_len
    # DPO's reference forward is work the objective needs: counted, as runs count it (metrics.flops)
    reference = (2.0 * matmul + attention / 3) if w.reference_forward else 0.0
    if w.full:
        return 6.0 * matmul + attention + reference
    return 4.0 * matmul + 6.0 * w.active_lora_params + attention + reference


def predict(cfg: RunConfig, gpu: Gpu, world: int = 1, measured: list[tuple[str, dict]] = (),
            evaluates: bool = False) -> Prediction:
    """The prediction for `cfg` on `world` GPUs of kind `gpu`; `measured`: (hw record id, metrics) to use;
    `evaluates`: a train job that evaluates between its steps (its memory has that phase too)."""
    w = workload(cfg, world, evaluates)
    hw = hardware(gpu, measured)
    return Prediction(w.cfg, world, hw, memory(w), step_time(w, hw), model_flops_per_token(w), w)


__all__ = ["Prediction", "Workload", "predict", "workload"]
