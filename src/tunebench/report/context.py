"""What every report section reads: the records, grouped and priced once."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tunebench.config import RunConfig, not_levers
from tunebench.format import label
from tunebench.record import ResultRecord
from tunebench.report.cost import DEFAULT_JOB_SAMPLES, Cost, Offering, cheapest

NOISE = 0.05  # effects smaller than this are reported as no measurable change
CV_LIMIT = 0.02  # repeats whose throughput varies more than this are flagged as noisy


@dataclass
class ReportContext:
    records: list[ResultRecord]  # every record in the report, all kinds
    out: Path  # the report folder (plots are written here)
    prices: list[Offering] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # config hash -> sweep entry name
    job_samples: int = DEFAULT_JOB_SAMPLES

    def __post_init__(self) -> None:
        self.train = [r for r in self.records if r.kind == "train"]
        self.ok = [r for r in self.train if r.status == "ok" and r.metrics.tokens_per_s]
        self.groups: dict[str, list[ResultRecord]] = {}
        for r in self.train:
            self.groups.setdefault(r.config_hash, []).append(r)
        self.costs: dict[str, Cost | None] = {r.id: cheapest(r, self.prices, job_samples=self.job_samples)
                                              for r in self.ok}
        self.spot = {r.id: cheapest(r, self.prices, spot=True, job_samples=self.job_samples) for r in self.ok}
        self.baseline = next((rs for rs in self.groups.values() if mean_tps(rs)), None)
        # bf16 MAMF (TFLOP/s) by GPU name, from `tunebench hw` records, for the fraction of MAMF
        self.mamf = {r.metrics.device_name: r.metrics.mamf_tflops for r in self.records
                     if r.kind == "hw" and r.metrics.mamf_dtype == "bf16" and r.metrics.mamf_tflops}

    def label(self, rec: ResultRecord) -> str:
        return label(rec, self.names)

    def kind(self, kind: str) -> list[ResultRecord]:
        return [r for r in self.records if r.kind == kind]

    def lever(self, rs: list[ResultRecord]) -> str:
        """A configuration's name against the baseline: its sweep name, or what differs from the baseline."""
        return self.names.get(rs[0].config_hash) or lever_name(diff(self.baseline[0].config, rs[0].config))

    def effects(self) -> list[tuple[list[ResultRecord], float | None]]:
        """Each configuration other than the baseline with its tokens/s change (None: it never ran ok)."""
        b_tps = mean_tps(self.baseline)
        return [(rs, None if (tps := mean_tps(rs)) is None else tps / b_tps - 1)
                for rs in self.groups.values() if rs is not self.baseline]


def mean_tps(rs: list[ResultRecord]) -> float | None:
    ok = [r.metrics.tokens_per_s for r in rs if r.status == "ok" and r.metrics.tokens_per_s]
    return statistics.fmean(ok) if ok else None


def diff(base: dict, other: dict) -> dict[str, tuple]:
    """The workload keys two configurations differ in (launch and measurement settings are not levers)."""
    keys = (set(base) | set(other)) - not_levers(RunConfig)
    return {k: (base.get(k), other.get(k)) for k in sorted(keys) if base.get(k) != other.get(k)}


def lever_name(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items()) or "same configuration"
