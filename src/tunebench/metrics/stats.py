"""Summary statistics of per-step times."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99),
        "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }
