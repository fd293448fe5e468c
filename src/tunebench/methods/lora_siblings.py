"""LoRA layers that read the same input, run as one: attention's q/k/v, the MLP's gate/up.

peft runs each LoRA layer alone: the base matmul, then x·Aᵀ (a GEMM of `rank` columns that reads the whole
input), ·Bᵀ, a scale and an add (for a 4-bit base, after a defensive clone of the base's output), with x cast to
the adapter's fp32 and back first. For q, k and v that is three thin GEMMs over one input in forward and three
more passes over it in backward. Here the siblings of a block run together: their A matrices stacked, one
x·[A_q; A_k; A_v]ᵀ, and each B product added to its base output in the matmul's epilogue (addmm) rather than by a
separate elementwise pass: a little faster and smaller than peft's layers apart, checkpointed or not
(benchmarks/results/qlora-lora.md). The base weights themselves as one GEMM over [W_q; W_k; W_v] (stored as views
of one tensor) was tried too and dropped: no faster, and the saved value's view kept the whole output alive.

The first sibling called computes the stacked product and the next ones, called with the same input, use it (any
other call runs peft's own forward); compiled, dynamo traces that hand-over into the block's one graph. Not inside
a checkpoint that compile traces (ours, keeping matmuls or recomputing the block whole, i.e. every checkpointed
block of a compiled model; Hugging Face's in a whole-model graph): dynamo refuses the
hand-over there (a side effect), and letting each sibling compute the product for the compiler to merge was
slower than peft's layers apart (the forward merges, but each copy keeps its own backward); the
runner leaves those blocks' layers apart. Modules, parameters, names and saved adapters stay peft's.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
ADAPTER = "default"


def plain_lora(m: nn.Module) -> bool:
    """A peft LoRA linear layer with one vanilla adapter: no dropout, no DoRA or other variant, not merged."""
    from peft.tuners.lora import LoraLayer

    if not isinstance(m, LoraLayer) or not hasattr(m, "lora_A") or ADAPTER not in m.lora_A:
        return False
    a, b = m.lora_A[ADAPTER], m.lora_B[ADAPTER]
    return (list(m.active_adapters) == [ADAPTER] and not m.merged and not m.disable_adapters
            and ADAPTER not in getattr(m, "lora_variant", {}) and isinstance(m.lora_dropout[ADAPTER], nn.Identity)
            and type(a) is nn.Linear and type(b) is nn.Linear and a.bias is None and b.bias is None)


class SiblingGroup:
    """The LoRA layers of one block that read the same input. Not a module, so nothing of it is saved; each member
    refers to it as a plain attribute, so that a deep copy of the model copies it with its members."""

    def __init__(self, members: list[nn.Module]):
        self.members = members
        self._input: torch.Tensor | None = None
        self._down: torch.Tensor | None = None  # x·[A_1; A_2; ...]ᵀ of that input

    def usable(self, x: torch.Tensor) -> bool:
        # without autocast peft computes the adapters in their own dtype and casts back; alike dtypes only here
        autocast = torch.is_autocast_enabled(x.device.type)
        return all(plain_lora(m) and (autocast or m.lora_A[ADAPTER].weight.dtype == x.dtype) for m in self.members)

    def output(self, index: int, x: torch.Tensor, alone: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if index == 0:
            self._input = self._down = None
            if not self.usable(x):
                return alone(x)
            self._input = x
            try:
                self._down = self._stacked(x)
            except BaseException:
                self._input = None
                raise
        elif self._input is not x or self._down is None:  # not called as the block calls them: peft's own way
            self._input = self._down = None
            return alone(x)
        down = self._down
        if index == len(self.members) - 1:
            self._input = self._down = None
        return self._one(index, x, down)

    def _stacked(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.cat([m.lora_A[ADAPTER].weight for m in self.members])
        return F.linear(x.reshape(-1, x.shape[-1]), a)

    def _one(self, index: int, x: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """This sibling's output: its base layer's, plus its columns of the stacked product times its B, scaled,
        added in the matmul's epilogue."""
        m = self.members[index]
        start = sum(s.lora_A[ADAPTER].out_features for s in self.members[:index])
        b = m.lora_B[ADAPTER]
        base = m.base_layer(x)
        out = torch.addmm(base.reshape(-1, base.shape[-1]), down[:, start:start + b.in_features],
                          (b.weight * m.scaling[ADAPTER]).t())
        return out.view(*x.shape[:-1], -1)


def _grouped_forward(self: nn.Module, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A sibling's forward: through its group, or peft's own (its class's) for any other kind of call."""
    alone = functools.partial(type(self).forward, self)
    if args or kwargs:
        return alone(x, *args, **kwargs)
    return self.sibling_group.output(self.sibling_index, x, alone)


def group_siblings(block: nn.Module) -> list[SiblingGroup]:
    """Group the sibling LoRA layers under each module of `block`; returns the groups made."""
    groups = []
    for parent in block.modules():
        for names in SIBLINGS:
            members = [getattr(parent, n, None) for n in names]
            if not all(m is not None and plain_lora(m) and "forward" not in vars(m) for m in members):
                continue
            group = SiblingGroup(members)
            for i, m in enumerate(members):
                m.sibling_group, m.sibling_index = group, i
                m.forward = types.MethodType(_grouped_forward, m)
            groups.append(group)
    return groups
