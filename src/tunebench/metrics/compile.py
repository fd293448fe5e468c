"""Time spent compiling: torch.compile's own accounting, so a report can show it apart from the steps."""

from __future__ import annotations

# dynamo's timers: tracing and inductor for each forward graph, and each backward graph compiled lazily
# at its first backward
COMPILE_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def compile_seconds() -> float | None:
    """Seconds torch.compile has spent in this process so far; None where torch keeps no such account."""
    try:
        from torch._dynamo.utils import compile_times

        names, values = compile_times(repr="csv", aggregate=True)
    except Exception:  # a private API: a torch without it gives no figure rather than a wrong one
        return None
    spent = dict(zip(names, values))
    return sum(float(spent.get(k, 0.0)) for k in COMPILE_TIMERS)
