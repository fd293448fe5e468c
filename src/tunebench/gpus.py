"""GPU catalog: the published figures of the GPUs we plan for, and which one this machine has.

No torch here: `tunebench plan` reads this in well under a second. Figures are the vendors' dense
(no sparsity) bf16 peaks, fp32 peaks (CUDA cores: fp32 matmuls without TF32, PyTorch's default) and HBM
bandwidths; `memory_bytes` is what the driver reports (nvidia-smi, torch.cuda), which is a little less than
the marketing figure. `link_gbps` is the per-GPU bandwidth one direction to the other GPUs of the node
(NVLink, or PCIe where there is none): the ceiling of a collective's bus bandwidth. Measured figures
(`tunebench hw` records) take precedence where stored.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from tunebench.errors import UserError

MIB = 1 << 20


@dataclass(frozen=True)
class Gpu:
    name: str  # what --gpu takes
    pattern: str  # searched (case-insensitive) in the name the driver reports
    memory_bytes: int
    bf16_tflops: float  # dense peak
    hbm_gbps: float
    link_gbps: float  # per GPU, one direction, within a node
    fp32_tflops: float  # CUDA cores' peak, what fp32 matmuls without TF32 and fp32 attention run on
    fp8: bool = False  # FP8 tensor cores (compute capability 8.9+)
    tf32: bool = True  # TF32 tensor cores (compute capability 8.0+), at half the bf16 peak

    @property
    def peak_flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def fp32_peak_flops(self) -> float:
        return self.fp32_tflops * 1e12

    @property
    def tf32_peak_flops(self) -> float:  # where `tf32`
        return self.peak_flops / 2


# Most specific patterns first: "H100 NVL" and "H100 PCIe" before "H100".
CATALOG: tuple[Gpu, ...] = (
    Gpu("B200", r"B200", 183359 * MIB, 2250, 8000, 900, 75, fp8=True),
    Gpu("H200-NVL", r"H200 NVL", 143771 * MIB, 835, 4800, 450, 60, fp8=True),
    Gpu("H200", r"H200", 143771 * MIB, 989, 4800, 450, 67, fp8=True),
    Gpu("GH200", r"GH200", 97871 * MIB, 989, 4000, 450, 67, fp8=True),
    Gpu("H100-NVL", r"H100 NVL", 95830 * MIB, 835, 3900, 300, 60, fp8=True),
    Gpu("H100-PCIe", r"H100 PCIe", 81559 * MIB, 756, 2000, 64, 51, fp8=True),
    Gpu("H100-80GB", r"H100|H800", 81559 * MIB, 989, 3350, 450, 67, fp8=True),
    Gpu("A100-40GB", r"A100.*40GB|A100-SXM4-40GB|A100-PCIE-40GB", 40960 * MIB, 312, 1555, 300, 19.5),
    Gpu("A100-80GB", r"A100|A800", 81920 * MIB, 312, 2039, 300, 19.5),
    Gpu("L40S", r"L40S", 46068 * MIB, 362, 864, 32, 91.6, fp8=True),
    Gpu("L40", r"L40\b", 46068 * MIB, 181, 864, 32, 90.5, fp8=True),
    Gpu("L4", r"\bL4\b", 23034 * MIB, 121, 300, 32, 30.3, fp8=True),
    Gpu("A10", r"\bA10\b", 23028 * MIB, 125, 600, 32, 31.2),
    Gpu("RTX-4090", r"4090", 24564 * MIB, 165, 1008, 32, 82.6, fp8=True),
    Gpu("A6000", r"A6000", 49140 * MIB, 155, 768, 56, 38.7),
    Gpu("V100", r"V100", 32768 * MIB, 125, 900, 150, 15.7, tf32=False),  # no bf16: its fp16 peak
)
_BY_NAME = {g.name.lower(): g for g in CATALOG}


def known() -> str:
    return ", ".join(g.name for g in CATALOG)


def gpu_named(name: str) -> Gpu:
    """A catalog GPU by its --gpu name (H100-80GB), or by a driver-reported name (NVIDIA H100 80GB HBM3)."""
    # a name is one printable line: "H100\nrm -rf" must not pass as an H100 because it contains one
    found = _BY_NAME.get(name.strip().lower()) or (match(name) if name.isprintable() else None)
    if found is None:
        raise UserError(f"unknown GPU {name!r}: known GPUs are {known()}")
    return found


def match(device_name: str | None) -> Gpu | None:
    """The catalog entry for a name the driver reports; None for a GPU we have no figures for."""
    if not device_name:
        return None
    return next((g for g in CATALOG if re.search(g.pattern, device_name, re.IGNORECASE)), None)


def detect() -> tuple[str, int] | None:
    """(name, count) of this machine's GPUs from nvidia-smi, without importing torch; None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return (names[0], len(names)) if names else None
