"""save_pretrained without accelerate's DeepSpeed probe.

transformers' save_pretrained unwraps the model through accelerate, which imports DeepSpeed (where it is installed)
only to ask whether the model is a DeepSpeedEngine: 1.6 s on a CPU and a "Setting accelerator" warning line in every
process that saves a checkpoint or a model, under any strategy. No object is an instance of a class never imported,
so while DeepSpeed is not imported the question is answered without importing it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch import nn


@contextmanager
def no_deepspeed_probe() -> Iterator[None]:
    try:
        from accelerate.utils import other
    except ImportError:  # no accelerate: transformers unwraps without it
        yield
        return
    probe = getattr(other, "is_deepspeed_available", None)
    if probe is None or "deepspeed" in sys.modules:  # another accelerate, or DeepSpeed runs here: ask it
        yield
        return
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = probe


def save_pretrained(model: nn.Module, path: str | Path, **kwargs) -> None:
    """`model.save_pretrained(path, **kwargs)` (a transformers or peft model), DeepSpeed left unimported."""
    with no_deepspeed_probe():
        model.save_pretrained(path, **kwargs)
