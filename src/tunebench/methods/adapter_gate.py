"""The adapters' scales held in tensors, so that DPO's reference (the adapters off) runs the policy's own graph.

peft multiplies each adapter's output by its scale, a Python float, and disables its adapters by taking another path
through every layer. Compiled, that other path is another graph: its fusions, and so the order its kernels sum in,
differ from the policy's training graph, and DPO reads the two graphs' log-probabilities summed over whole answers.
With each scale a 0-dim tensor, closing the gate (the tensors set to zero) changes values, not the graph: the
reference is the policy's own forward with every adapter's output times zero, which is the base's output exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def _scaled_layers(model: nn.Module) -> Iterator[dict]:
    """The `scaling` dict (adapter name -> scale) of each of peft's LoRA layers, 3-D expert weights' included."""
    for m in model.modules():
        scaling = getattr(m, "scaling", None)
        if isinstance(scaling, dict) and hasattr(m, "lora_A"):
            yield scaling


class AdapterGate:
    """Every adapter's scale as a tensor on the compute device, one tensor for each distinct scale (a handful), set
    to zero while the gate is closed. Installed on the first forward, before anything is compiled: on the device the
    batch is on, after any sharding placed the weights."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._scales: list[tuple[torch.Tensor, float]] = []
        self.installed = False

    def install(self, device: torch.device) -> None:
        shared: dict[float, torch.Tensor] = {}
        for scaling in _scaled_layers(self.model):
            for name, value in scaling.items():
                if isinstance(value, torch.Tensor):
                    continue
                if value not in shared:
                    shared[value] = torch.tensor(float(value), dtype=torch.float32, device=device)
                    self._scales.append((shared[value], float(value)))
                scaling[name] = shared[value]
        self.installed = True

    @contextlib.contextmanager
    def closed(self) -> Iterator[None]:
        """Every adapter's contribution multiplied by zero inside; its scale back after."""
        with torch.no_grad():
            for t, _ in self._scales:
                t.zero_()
        try:
            yield
        finally:
            with torch.no_grad():
                for t, value in self._scales:
                    t.fill_(value)
