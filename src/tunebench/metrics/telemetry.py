"""GPU telemetry from NVML, sampled in a background thread over the timed steps.

Utilization, power, temperature, SM clock and throttle reasons every `interval` seconds; energy
from the GPU's own energy counter where it has one (else power integrated over the samples).
Without NVML (CPU runs, no driver) nothing is sampled and the record has no telemetry fields:
absent, never zero. The thread makes a handful of NVML calls per sample, negligible beside a step
(benchmarks/probes/telemetry_overhead.py measures it).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Mapping
from typing import Any

from tunebench.record import GpuTelemetry, RunTelemetry

# nvmlClocksEventReason* bit -> name (the throttle reasons nvidia-smi reports)
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
           0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


class Telemetry:
    def __init__(self, index: int, interval: float = 0.1):
        self.index, self.interval = index, interval
        self.samples: list[tuple[float, ...]] = []
        self.reasons = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._energy0 = None
        self._t0 = 0.0

    def start(self) -> bool:
        """Begin sampling; False (and nothing recorded) when NVML is not available."""
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._nvml = pynvml
        except Exception:
            return False
        self._energy0 = self._energy_mj()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="tunebench-telemetry", daemon=True)
        self._thread.start()
        return True

    def _energy_mj(self) -> int | None:
        try:
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except Exception:  # older GPUs have no energy counter
            return None

    def _sample(self) -> None:
        n, h = self._nvml, self._handle
        util = n.nvmlDeviceGetUtilizationRates(h).gpu
        power = n.nvmlDeviceGetPowerUsage(h) / 1000.0
        temp = n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
        clock = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
        try:
            self.reasons |= n.nvmlDeviceGetCurrentClocksEventReasons(h)
        except Exception:
            pass
        self.samples.append((time.perf_counter(), util, power, temp, clock))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:
                return
            self._stop.wait(self.interval)

    def stop(self) -> GpuTelemetry | None:
        """The summary of the samples; None without NVML, without samples, or once already stopped."""
        if not self._nvml:
            return None
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        wall = time.perf_counter() - self._t0
        e1 = self._energy_mj()
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        self._nvml = None  # stopped: a second stop() is a no-op
        if not self.samples:
            return None
        _, util, power, temp, clock = zip(*self.samples)
        energy = (e1 - self._energy0) / 1000.0 if e1 is not None and self._energy0 is not None \
            else statistics.fmean(power) * wall
        return GpuTelemetry(
            samples=len(self.samples), interval_s=self.interval, wall_s=wall,
            gpu_util_mean_pct=statistics.fmean(util), gpu_util_min_pct=min(util),
            power_mean_w=statistics.fmean(power), power_max_w=max(power), energy_j=energy,
            energy_source="counter" if e1 is not None else "power x time",
            temperature_max_c=max(temp), sm_clock_mean_mhz=statistics.fmean(clock), sm_clock_min_mhz=min(clock),
            throttle_reasons=sorted(name for bit, name in REASONS.items() if self.reasons & bit))


def combine(per_rank: list[GpuTelemetry | Mapping[str, Any] | None]) -> RunTelemetry | None:
    """One GPU's summary per rank -> the run's: energy summed, the worst clock/temperature kept."""
    ranks = [t for t in per_rank if t]
    if not ranks:
        return None
    return RunTelemetry(
        gpus=len(ranks), energy_j=sum(t["energy_j"] for t in ranks),
        power_mean_w=sum(t["power_mean_w"] for t in ranks),
        gpu_util_mean_pct=statistics.fmean(t["gpu_util_mean_pct"] for t in ranks),
        temperature_max_c=max(t["temperature_max_c"] for t in ranks),
        sm_clock_min_mhz=min(t["sm_clock_min_mhz"] for t in ranks),
        sm_clock_mean_mhz=statistics.fmean(t["sm_clock_mean_mhz"] for t in ranks),
        throttle_reasons=sorted({r for t in ranks for r in t["throttle_reasons"]}),
        energy_source=ranks[0]["energy_source"], samples=sum(t["samples"] for t in ranks))


def start(device, enabled: bool = True) -> Telemetry | None:
    """A sampler running on this GPU, or None: CPU, telemetry off, or no NVML (then fields stay absent)."""
    if not enabled or getattr(device, "type", None) != "cuda":
        return None
    t = Telemetry(device.index or 0)
    return t if t.start() else None
