"""The timed loop's progress figures: what a training job's log line is computed from."""

import torch

from tunebench.engine.loop import LoopResult, LoopSpec, _between_steps, _Reader
from tunebench.metrics.timer import StepTimer


class _Log:
    def __init__(self):
        self.timed_steps: list[int] = []

    def due(self, done: int) -> bool:
        return False

    def run(self, done, result, stop) -> bool:
        return False

    def log(self, done, result, timed_s, timed_steps) -> None:
        self.timed_steps.append(timed_steps)


def test_progress_counts_the_timed_steps_the_device_finished():
    """On a GPU the host queues up to LAG steps ahead of the device: the rate logged counts the timed steps read
    back (finished), not those queued, which overstated it early in the timed region."""
    result, hooks, lag = LoopResult(), _Log(), 2
    reader, timer, spec = _Reader(False, lag, result), StepTimer(torch.device("cpu")), LoopSpec(steps=8, warmup=2)
    for i in range(spec.steps):
        if i == spec.warmup:
            timer.start()
        reader.queue(i, torch.tensor([1.0, 0.0]))
        if i >= spec.warmup:
            timer.step_end()
        reader.read(i - lag)
        _between_steps(hooks, i + 1, reader, timer, result, spec)
    # queued by then: 0, 0, 1, 2, 3, 4, 5, 6 timed steps; read back: two steps later
    assert hooks.timed_steps == [0, 0, 0, 0, 1, 2, 3, 4]
    assert len(timer.spans) == 6
