"""Tables of a finished tune: every run measured, and the best against the baseline."""

from __future__ import annotations

from typing import Any

from tunebench.document import Table
from tunebench.format import fmt, gib
from tunebench.tune.space import describe


def _name(c: Any) -> str:
    return describe(c.cfg)


def result_tables(result: Any) -> list[Table]:
    """`result`: api.tune.TuneResult (its tuner's measured candidates, the best, the baseline, the front)."""
    front = {c.record.id for _, c in result.front}
    best = result.best.record.id if result.best else None
    cpu = result.gpu == "CPU"  # ranked by a GPU's model; memory is the process's RSS, not GPU allocations

    def memory(m: Any) -> str:
        return gib(m.peak_rss_bytes if cpu else m.peak_mem_allocated_bytes)

    runs = Table(["#", "candidate", "status", "tokens/s", "predicted (a GPU's model)" if cpu else "predicted",
                  "peak RSS (host)" if cpu else "peak alloc/GPU", "note"],
                 title=f"tune {result.id}: {result.runs} runs, goal {result.settings.objective}")
    for i, c in enumerate(result.tuner.measured, 1):
        m = c.record.metrics
        note = [w for w, on in (("best", c.record.id == best), ("Pareto front", c.record.id in front),
                                ("baseline", c is result.baseline), ("abandoned early", m.stopped_early)) if on]
        runs.add(str(i), _name(c), c.record.status, fmt(m.tokens_per_s, ",.0f"),
                 fmt(c.prediction.tokens_per_s if c.prediction else None, ",.0f"), memory(m), ", ".join(note))
    tables = [runs]
    if result.best:
        s = Table(["", ""], title="result", show_header=False)
        b, x = result.baseline, result.best
        s.add("best", f"{_name(x)}: {result.tuner.objective.describe(result.tuner.value(x))}")
        if b and b.record.status == "ok":
            s.add("baseline", f"{_name(b)}: {fmt(b.record.metrics.tokens_per_s, ',.0f')} tokens/s, "
                              f"{memory(b.record.metrics)}" + (" peak RSS" if cpu else ""))
        elif b:
            s.add("baseline", f"{_name(b)}: {b.record.status}")
        if result.speedup and result.settings.objective != "context":  # longer sequences run slower, by design
            s.add("speedup over the baseline", f"{result.speedup:.2f}x tokens/s")
        s.add("budget used", f"{result.runs} runs, {result.seconds / 60:.1f} minutes on {result.gpu}")
        for k, path in result.files.items():
            s.add(k, str(path))
        tables.append(s)
    return tables
