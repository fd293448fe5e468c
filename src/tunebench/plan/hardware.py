"""The figures a prediction runs on: measured by `tunebench hw` where the store has them, else the catalog's.

Without a measured record the matmul ceiling is 80% of the dense peak (MAMF measured 80.5-81% on H200), fp32's
76% of the CUDA cores' peak (51.1 of 67 TFLOP/s on an H100, TF32 off), TF32's 80% of its tensor-core peak
(404.3 of 494.7 on an H100),
memory bandwidth 81% of the spec (device copy measured 3878 of 4800 GB/s on the 4-GPU H200 host whose
figures calibrated plan.speed; 4236 on a 1-GPU host) and a collective's bus bandwidth 78% of the GPU's
link (all-reduce measured 353 of 450 GB/s on 4 H200). The host's constants in plan.speed are the H200
machine's; a measured host dispatch time (hw.host) scales them to this machine's host.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tunebench.gpus import Gpu

MAMF_OF_PEAK = 0.80
FP32_MAMF_OF_PEAK = 0.76
COPY_OF_SPEC = 0.81
BUSBW_OF_LINK = 0.78
INTER_NODE_GBPS = 25.0  # per GPU across nodes (200 Gb/s NICs) when nothing was measured
# hw.host's figure on the H200 machine whose runs fitted plan.speed's host constants (benchmarks/RESULTS.md)
REFERENCE_HOST_DISPATCH_US = 1648.0


@dataclass(frozen=True)
class Hardware:
    gpu: Gpu
    matmul_flops: float  # achievable bf16 FLOP/s (MAMF)
    fp32_matmul_flops: float  # achievable fp32 FLOP/s without TF32 (the fp32 MAMF)
    tf32_matmul_flops: float  # ... with TF32 (its MAMF)
    bandwidth: float  # device memory bytes/s (copy, read + write)
    busbw: dict[str, float] = field(default_factory=dict)  # collective -> bus bandwidth, bytes/s, within a node
    source: str = "spec sheet"
    host_scale: float = 1.0  # this host's launch time against the one plan.speed's host constants were measured on

    def collective(self, op: str, nnodes: int = 1) -> float:
        if nnodes > 1:
            return INTER_NODE_GBPS * 1e9
        return self.busbw.get(op) or BUSBW_OF_LINK * self.gpu.link_gbps * 1e9


def hardware(gpu: Gpu, measured: list[tuple[str, dict]] = ()) -> Hardware:
    """The GPU's figures, each replaced by the newest measurement that has it (the host's: the median of all),
    from (record id, hw metrics) pairs."""
    mamf = bandwidth = None
    sweeps: dict[str, float] = {}  # fp32 and tf32 MAMFs from the newest records' sweeps of them
    hosts: list[float] = []
    busbw: dict[str, float] = {}
    used = []
    for rec_id, m in measured:
        if mamf is None and m.get("mamf_tflops") and m.get("mamf_dtype") == "bf16":
            mamf, used = m["mamf_tflops"] * 1e12, used + [rec_id]
        for sweep in m.get("matmul") or ():
            if sweep.get("dtype") in ("fp32", "tf32") and sweep["dtype"] not in sweeps:
                sweeps[sweep["dtype"]], used = sweep["best_mean_tflops"] * 1e12, used + [rec_id]
        if bandwidth is None and m.get("copy_gbps"):
            bandwidth, used = m["copy_gbps"] * 1e9, used + [rec_id]
        if m.get("host_dispatch_us"):  # every one: a host's figure varies 10% from run to run
            hosts, used = hosts + [m["host_dispatch_us"]], used + [rec_id]
        for op, gbps in (m.get("busbw_peak_gbps") or {}).items():
            if op not in busbw:
                busbw[op] = gbps * 1e9
                used.append(rec_id)
    source = ("measured: hw " + ", ".join(dict.fromkeys(used)) + (" (the rest from the spec sheet)" if
                                                                   None in (mamf, bandwidth) or not busbw else "")
              if used else "spec sheet")
    host_scale = min(4.0, max(0.25, statistics.median(hosts) / REFERENCE_HOST_DISPATCH_US)) if hosts else 1.0
    fp32 = sweeps.get("fp32") or FP32_MAMF_OF_PEAK * gpu.fp32_peak_flops
    tf32 = sweeps.get("tf32") or (MAMF_OF_PEAK * gpu.tf32_peak_flops if gpu.tf32 else fp32)
    return Hardware(gpu, mamf or MAMF_OF_PEAK * gpu.peak_flops, fp32, tf32,
                    bandwidth or COPY_OF_SPEC * gpu.hbm_gbps * 1e9, busbw, source, host_scale)
