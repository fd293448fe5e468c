"""What every report section reads: the records, grouped and priced once."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tunebench.config import RunConfig, not_levers
from tunebench.format import label
from tunebench.record import ResultRecord
from tunebench.report.cost import DEFAULT_JOB_SAMPLES, Cost, Offering, cheapest

# the smallest noise an effect must exceed, however steady the runs: below it a change is no finding
NOISE_FLOOR = 0.02
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
        # Repeats are runs of one configuration in one environment: the same config on another GPU, or
        # with another torch or tunebench, is another group (never averaged together).
        self.groups: dict[tuple, list[ResultRecord]] = {}
        for r in self.train:
            self.groups.setdefault((r.config_hash, environment_key(r)), []).append(r)
        self.configs = len({h for h, _ in self.groups})
        self._envs: dict[str, int] = {}
        for h, _ in self.groups:
            self._envs[h] = self._envs.get(h, 0) + 1
        self.costs: dict[str, Cost | None] = {r.id: cheapest(r, self.prices, job_samples=self.job_samples)
                                              for r in self.ok}
        self.spot = {r.id: cheapest(r, self.prices, spot=True, job_samples=self.job_samples) for r in self.ok}
        self.baseline = next((rs for rs in self.groups.values() if mean_tps(rs)), None)
        # bf16 MAMF (TFLOP/s) by GPU name, from `tunebench hw` records, for the fraction of MAMF
        self.mamf = {r.metrics.device_name: r.metrics.mamf_tflops for r in self.records
                     if r.kind == "hw" and r.metrics.mamf_dtype == "bf16" and r.metrics.mamf_tflops}

    def label(self, rec: ResultRecord) -> str:
        """The run's label; where its configuration ran in several environments, the environment is added."""
        base = label(rec, self.names)
        if self._envs.get(rec.config_hash, 1) > 1:
            device, torch_v, tb = environment_key(rec)
            base += f" [{device}, torch {torch_v}, tunebench {tb}]"
        return base

    def kind(self, kind: str) -> list[ResultRecord]:
        return [r for r in self.records if r.kind == kind]

    def lever(self, rs: list[ResultRecord]) -> str:
        """A configuration's name against the baseline: its sweep name, or what differs from the baseline."""
        return self.names.get(rs[0].config_hash) or lever_name(diff(self.baseline[0].config, rs[0].config))

    def effects(self) -> list[tuple[list[ResultRecord], float | None, float]]:
        """Each group other than the baseline: its tokens/s change (None: it never ran ok), and the noise
        that change has to exceed to count: twice the larger spread of the two groups' repeated runs
        or of their runs' steps (a busy machine's runs scatter), and at least NOISE_FLOOR."""
        b_tps = mean_tps(self.baseline)
        return [(rs, None if (tps := mean_tps(rs)) is None else tps / b_tps - 1,
                 max(NOISE_FLOOR, 2 * spread(rs), 2 * spread(self.baseline)))
                for rs in self.groups.values() if rs is not self.baseline]


def environment_key(r: ResultRecord) -> tuple[str, str, str]:
    """Where a run ran, as far as its speed goes: the device, torch, and tunebench's commit (or version)."""
    env = r.environment
    device = env.get("gpu", {}).get("name") or env.get("cpu", {}).get("model") or env.get("device") or "?"
    tb = env.get("tunebench", {})
    return (str(device), str(env.get("versions", {}).get("torch")),
            str((tb.get("git_commit") or "")[:8] or tb.get("version")))


def cv(rs: list[ResultRecord]) -> float:
    """The coefficient of variation of a group's ok throughputs (0 with fewer than two)."""
    t = [r.metrics.tokens_per_s for r in rs if r.status == "ok" and r.metrics.tokens_per_s]
    return statistics.stdev(t) / statistics.fmean(t) if len(t) > 1 else 0.0


def spread(rs: list[ResultRecord]) -> float:
    """How much a group's throughput is measured to scatter: the spread of its repeated runs' tokens/s, or of one
    run's step times (std / mean), whichever is larger."""
    steps = [r.metrics.step_time_s.std / r.metrics.step_time_s.mean for r in rs
             if r.status == "ok" and r.metrics.step_time_s and r.metrics.step_time_s.mean]
    return max([cv(rs), *steps])


def mean_tps(rs: list[ResultRecord]) -> float | None:
    ok = [r.metrics.tokens_per_s for r in rs if r.status == "ok" and r.metrics.tokens_per_s]
    return statistics.fmean(ok) if ok else None


def diff(base: dict, other: dict) -> dict[str, tuple]:
    """The workload keys two configurations differ in (launch and measurement settings are not levers)."""
    keys = (set(base) | set(other)) & set(RunConfig.model_fields) - not_levers(RunConfig)  # a job's data: no lever
    return {k: (base.get(k), other.get(k)) for k in sorted(keys) if base.get(k) != other.get(k)}


def lever_name(changes: dict[str, tuple]) -> str:
    return ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changes.items()) or "same configuration"
