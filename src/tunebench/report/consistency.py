"""Node-to-node / GPU-to-GPU consistency: the same configuration's spread against the seeds' bars.

The seeds accept ±5% throughput and ±2% memory between nodes. Each run is compared with the median
of all runs; a run outside a bar is an outlier, shown with its clocks, temperature and throttle
reasons where the record has telemetry.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tunebench.document import Table
from tunebench.format import gib, pct
from tunebench.record import ResultRecord

THROUGHPUT_BAR = 0.05
MEMORY_BAR = 0.02


@dataclass
class Consistency:
    records: list[ResultRecord]
    tps_dev: list[float]  # (x - median) / median per record
    mem_dev: list[float | None]
    tps_spread: float  # (max - min) / mean
    mem_spread: float | None

    @property
    def ok(self) -> bool:
        mem_ok = all(d is None or abs(d) <= MEMORY_BAR for d in self.mem_dev)
        return all(abs(d) <= THROUGHPUT_BAR for d in self.tps_dev) and mem_ok


def _mem(r: ResultRecord) -> int | None:
    m = r.metrics
    return m.peak_mem_allocated_bytes if m.peak_mem_allocated_bytes is not None else m.peak_rss_bytes


def analyse(records: list[ResultRecord]) -> Consistency:
    tps = [r.metrics.tokens_per_s for r in records]
    med = statistics.median(tps)
    mems = [_mem(r) for r in records]
    known = [m for m in mems if m]
    mem_med = statistics.median(known) if known else None
    return Consistency(
        records=records,
        tps_dev=[(x - med) / med for x in tps],
        mem_dev=[None if not m or not mem_med else (m - mem_med) / mem_med for m in mems],
        tps_spread=(max(tps) - min(tps)) / statistics.fmean(tps),
        mem_spread=(max(known) - min(known)) / statistics.fmean(known) if known else None,
    )


def device_label(r: ResultRecord) -> str:
    env = r.environment
    gpu = env.get("gpu", {})
    where = env.get("host", {}).get("hostname", "?")
    if gpu.get("name"):
        return f"{where} GPU {gpu.get('visible_devices') or gpu.get('index')} ({gpu['name']})"
    return f"{where} cpu"


def table(c: Consistency) -> Table:
    t = Table(["device", "tokens/s", "vs median", "peak memory", "vs median", "verdict", "telemetry"],
              title=f"consistency of {len(c.records)} runs: throughput spread {pct(c.tps_spread)} (bar ±5%), "
                    f"memory spread {pct(c.mem_spread)} (bar ±2%)")
    for r, dt, dm in zip(c.records, c.tps_dev, c.mem_dev):
        out = abs(dt) > THROUGHPUT_BAR or (dm is not None and abs(dm) > MEMORY_BAR)
        tel = r.metrics.telemetry
        tel_text = "no telemetry" if not tel else (
            f"SM clock min {tel.sm_clock_min_mhz} MHz, max {tel.temperature_max_c} C, throttle: "
            + (", ".join(tel.throttle_reasons) or "none"))
        t.add(device_label(r), f"{r.metrics.tokens_per_s:,.1f}", f"{dt:+.1%}", gib(_mem(r)),
              "-" if dm is None else f"{dm:+.1%}", "OUTLIER" if out else "ok", tel_text if out else "")
    return t
