"""Telemetry: absent without NVML (never zeros), and how per-GPU summaries combine."""

from conftest import run_json
from tunebench.metrics.telemetry import Telemetry, combine


def test_absent_without_nvml(tb, store):
    rec = run_json(tb, store)
    assert rec["metrics"]["telemetry"] is None and rec["metrics"]["energy_j_per_token"] is None
    t = Telemetry(0)
    assert t.start() is False and t.stop() is None  # this machine has no NVIDIA driver


def test_combine_over_ranks():
    a = {"energy_j": 100.0, "power_mean_w": 500.0, "gpu_util_mean_pct": 90.0, "temperature_max_c": 60,
         "sm_clock_min_mhz": 1900, "sm_clock_mean_mhz": 1980.0, "throttle_reasons": ["sw_power_cap"],
         "energy_source": "counter", "samples": 10}
    b = a | {"energy_j": 120.0, "temperature_max_c": 70, "sm_clock_min_mhz": 1700, "gpu_util_mean_pct": 80.0,
             "throttle_reasons": ["hw_thermal_slowdown", "sw_power_cap"]}
    c = combine([a, None, b])
    assert c["energy_j"] == 220.0 and c["power_mean_w"] == 1000.0 and c["gpus"] == 2
    assert c["temperature_max_c"] == 70 and c["sm_clock_min_mhz"] == 1700 and c["gpu_util_mean_pct"] == 85.0
    assert c["throttle_reasons"] == ["hw_thermal_slowdown", "sw_power_cap"]
    assert combine([None, None]) is None
