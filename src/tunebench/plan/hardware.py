"""The figures a prediction runs on: measured by `tunebench hw` where the store has them, else the catalog's.

Without a measured record the ceilings are shares of the spec sheet's figures (plan.calibration: the matmul
ceiling of the dense peak, fp32's of the CUDA cores' peak, memory bandwidth of the spec, a collective's bus
bandwidth of the GPU's link). The host rows of plan.calibration were fitted on one host; a measured host dispatch
time (hw.host) scales them to this machine's host.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tunebench.gpus import Gpu
from tunebench.plan.calibration import CAL


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
            return CAL.inter_node_gbps * 1e9
        return self.busbw.get(op) or CAL.busbw_of_link * self.gpu.link_gbps * 1e9


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
    host_scale = min(4.0, max(0.25, statistics.median(hosts) / CAL.reference_host_dispatch_us)) if hosts else 1.0
    fp32 = sweeps.get("fp32") or CAL.fp32_mamf_of_peak * gpu.fp32_peak_flops
    tf32 = sweeps.get("tf32") or (CAL.mamf_of_peak * gpu.tf32_peak_flops if gpu.tf32 else fp32)
    return Hardware(gpu, mamf or CAL.mamf_of_peak * gpu.peak_flops, fp32, tf32,
                    bandwidth or CAL.copy_of_spec * gpu.hbm_gbps * 1e9, busbw, source, host_scale)
