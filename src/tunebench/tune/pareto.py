"""The Pareto front of measured runs: no other run is at least as fast, as small and as cheap, and better in one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    key: str  # the run's id
    tokens_per_s: float  # higher is better
    memory: float  # peak bytes per GPU, lower is better
    cost: float | None  # $ per 1M tokens, lower is better (None: no price, left out of the comparison)


def dominates(a: Point, b: Point) -> bool:
    costs = a.cost is not None and b.cost is not None
    no_worse = (a.tokens_per_s >= b.tokens_per_s and a.memory <= b.memory and (not costs or a.cost <= b.cost))
    better = (a.tokens_per_s > b.tokens_per_s or a.memory < b.memory or (costs and a.cost < b.cost))
    return no_worse and better


def front(points: list[Point]) -> list[Point]:
    """The non-dominated points, fastest first."""
    keep = [p for p in points if not any(dominates(q, p) for q in points if q is not p)]
    return sorted(keep, key=lambda p: -p.tokens_per_s)
