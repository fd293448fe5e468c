"""The timed loop's progress figures: what a training job's log line is computed from."""

import torch

from tunebench.engine.loop import LoopResult, LoopSpec, _between_steps, _Reader
from tunebench.metrics.timer import StepTimer
from tunebench.trainer.hooks import loss_text


class _Log:
    def __init__(self):
        self.timed_steps: list[int] = []
        self.loss_steps: list[int] = []
        self.losses: list[float | None] = []

    def due(self, done: int) -> bool:
        return False

    def run(self, done, result, stop) -> bool:
        return False

    def log(self, done, result, timed_s, timed_steps, loss_step) -> None:
        self.timed_steps.append(timed_steps)
        self.loss_steps.append(loss_step)
        self.losses.append(result.losses[-1] if result.losses else None)


def test_progress_counts_the_timed_steps_the_device_finished():
    """On a GPU the host queues up to LAG steps ahead of the device: the rate logged counts the timed steps read
    back (finished), not those queued, which overstated it early in the timed region."""
    result, hooks, lag = LoopResult(), _Log(), 2
    reader, timer, spec = _Reader(False, lag, result), StepTimer(torch.device("cpu")), LoopSpec(steps=8, warmup=2)
    for i in range(spec.steps):
        if i == spec.warmup:
            timer.start()
        reader.queue(i, torch.tensor([float(i + 1), 0.0]))  # step i + 1's loss is i + 1
        if i >= spec.warmup:
            timer.step_end()
        reader.read(i - lag)
        _between_steps(hooks, i + 1, reader, timer, result, spec)
    # queued by then: 0, 0, 1, 2, 3, 4, 5, 6 timed steps; read back: two steps later, but at the last step (as at
    # any step with an evaluation or a checkpoint) every step is read before the line is logged
    assert hooks.timed_steps == [0, 0, 0, 0, 1, 2, 3, 6]
    # the loss a log line shows is that of the step named beside it, which trails the steps done by the lag
    assert hooks.loss_steps == [0, 0, 1, 2, 3, 4, 5, 8] and hooks.losses == [None, None, 1, 2, 3, 4, 5, 8]
    assert len(timer.spans) == 6


def test_a_log_line_names_the_step_its_loss_is_from():
    assert loss_text(2.5, 10, 10) == "loss 2.5000"
    assert loss_text(2.5, 8, 10) == "loss 2.5000 (step 8)"  # read back two steps late, as on a GPU
    assert loss_text(None, 0, 41) == "loss pending"  # just after a resume, nothing read back yet


def test_evaluation_casts_weights_without_keeping_their_copies(monkeypatch):
    """Evaluation runs under autocast with its weight cache off: the cache kept a 16-bit copy of every weight until
    the loop ended (Llama-3.2-1B's train job peaked 1.8 GiB higher with it); packed rows' bounds reach the model."""
    from tunebench.config.train import TrainConfig
    from tunebench.dist import SINGLE
    from tunebench.engine.data import Batch
    from tunebench.trainer import hooks

    ids = torch.tensor([[1, 2, 3, 4]])
    batch = Batch(ids, ids, torch.tensor([[0, 1, 0, 1]]), torch.tensor([0, 2, 4], dtype=torch.int32))
    monkeypatch.setattr(hooks, "eval_batches", lambda *a, **k: iter([batch, batch]))
    seen = []

    class Model(torch.nn.Module):
        def forward(self, ids, labels, positions, documents, reference=None):
            seen.append((torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled(), documents.tolist()))
            return torch.tensor(2.0)

    cfg = TrainConfig(model="tiny-llama", precision="bf16", device="cpu", data="unused.jsonl")
    assert hooks.evaluate(Model(), None, cfg, torch.device("cpu"), SINGLE) == 2.0
    assert seen == [(True, False, [0, 2, 4])] * 2
