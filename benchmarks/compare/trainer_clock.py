"""The clock the scripts that time a Hugging Face Trainer put on it (vs_hf_trainer, dpo_vs_trl): the steps after
`warmup` up to `steps`, synchronized on a GPU, and the first three losses logged."""

from __future__ import annotations

import time


def trainer_clock(warmup: int, steps: int, cuda: bool, reset_peak: bool = False):
    """A TrainerCallback: `.seconds` (the timed steps), `.losses`; `reset_peak` restarts the GPU's peak memory
    where timing starts."""
    import torch
    from transformers import TrainerCallback

    sync = torch.cuda.synchronize if cuda else (lambda: None)

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = self.t1 = None
            self.losses: list[float] = []

        @property
        def seconds(self) -> float:
            return self.t1 - self.t0

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and len(self.losses) < 3:
                self.losses.append(logs["loss"])

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == warmup:
                sync()
                if reset_peak:
                    torch.cuda.reset_peak_memory_stats()
                self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step == steps:
                sync()
                self.t1 = time.perf_counter()

    return Clock()
