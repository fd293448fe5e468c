"""Optimizer factory: PyTorch AdamW (foreach or fused) and bitsandbytes 8-bit / paged 8-bit AdamW.

bitsandbytes steps one tensor at a time and synchronizes the GPU after each (`sync_gpu`): with LoRA on every
linear layer of a 7B model that is 448 host round trips per step, the GPU idle through each of them
(benchmarks/results/qlora-lora.md). `packed` makes its step see the adapters as a few tensors: their values and
gradients are gathered into flat buffers per dtype of at most PACK_ELEMENTS each, stepped one buffer at a time and
copied back, so the step's copies are two buffers' worth whatever the adapters' size (a mixture of experts'
adapters on every expert outweigh the rest of a QLoRA model). Its 8-bit states are quantized in blocks of 256
elements, so a tensor whose size is a multiple of 256 (and above bitsandbytes' 8-bit minimum) gets exactly the
update it would get alone; other tensors are stepped as before. A saved state of one buffer per dtype (before
the bound) is cut to today's buffers as it loads.

Weight decay (`param_groups`) skips biases, norms and embeddings, as docs/training.md states.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from tunebench.config import PACKED_ELEMENTS, RunConfig

QUANT_BLOCK = 256  # bitsandbytes' blockwise 8-bit optimizer states: one scale per 256 elements
MIN_8BIT = 4096  # bitsandbytes' min_8bit_size: smaller tensors keep 32-bit states
# a buffer's elements at most (a tensor larger alone is a buffer of its own); read at each optimizer's making, so a
# test can bound it smaller
PACK_ELEMENTS = PACKED_ELEMENTS


# Hugging Face Trainer's names of parameters it does not decay (Trainer.get_decay_parameter_names, transformers 5),
# matched against the lower-cased full name
NO_DECAY_NAME = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")

Params = Iterable[nn.Parameter] | Iterable[dict[str, Any]]


def _exempt_module(m: nn.Module) -> bool:
    """A module none of whose own parameters decay: an embedding (token or position; a tied head is the same
    tensor), or a norm. Trainer knows norms by nn.LayerNorm and by name; the class name also catches a model's
    own norm (LlamaRMSNorm, T5LayerNorm) under whatever name it is given."""
    return isinstance(m, (nn.Embedding, nn.LayerNorm)) or type(m).__name__.endswith("Norm")


def no_decay_ids(module: nn.Module) -> set[int]:
    """The ids of `module`'s parameters weight decay leaves alone. Read from where each parameter is registered,
    so it holds for a model wrapped by DDP, sharded by FSDP2 (the DTensors registered in the modules) or
    partitioned by ZeRO-3; a parameter registered twice (a tied head) is exempt if either place says so."""
    ids: set[int] = set()
    for mname, m in module.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            if _exempt_module(m) or NO_DECAY_NAME.search((f"{mname}.{pname}" if mname else pname).lower()):
                ids.add(id(p))
    return ids


def param_groups(module: nn.Module, params: list[nn.Parameter], weight_decay: float) -> Params:
    """`params` (what trains, in order) as the optimizer takes them: without weight decay one group, as before
    groups existed (so its checkpoints still load); with it, the decayed ones, then the rest with weight_decay 0.
    No empty group (a LoRA model usually has nothing undecayed): DeepSpeed flattens each group into one buffer."""
    if not weight_decay:
        return params
    exempt = no_decay_ids(module)
    groups = [{"params": [p for p in params if id(p) not in exempt]},
              {"params": [p for p in params if id(p) in exempt], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(params: Params, cfg: RunConfig) -> torch.optim.Optimizer:
    """`params`: tensors, or groups (`param_groups`), which keep their own weight_decay."""
    kw = dict(lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, foreach=True, **kw)
    if cfg.optimizer == "adamw_fused":
        return torch.optim.AdamW(params, fused=True, **kw)
    import bitsandbytes as bnb

    cls = bnb.optim.AdamW8bit if cfg.optimizer == "adamw_8bit" else bnb.optim.PagedAdamW8bit
    # adapters only: a full model's tensors rarely share one shape of block, and its checkpoint is theirs
    return packed(cls)(params, **kw) if cfg.method != "full" else cls(params, **kw)


def _packable(p: torch.Tensor) -> bool:
    """A plain tensor (not an FSDP2 shard) whose 8-bit blocks are the same alone or packed."""
    return type(p.data) is torch.Tensor and p.numel() >= MIN_8BIT and p.numel() % QUANT_BLOCK == 0


def _runs(ps: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """`ps` in order, cut into runs of at most PACK_ELEMENTS elements."""
    runs: list[list[torch.Tensor]] = []
    count = PACK_ELEMENTS
    for p in ps:
        if count + p.numel() > PACK_ELEMENTS:
            runs.append([])
            count = 0
        runs[-1].append(p)
        count += p.numel()
    return runs


def _cut(state: dict[str, Any], numels: list[int]) -> list[dict[str, Any]]:
    """One buffer's bitsandbytes state as the states of consecutive buffers of `numels` elements: the 8-bit states
    element by element, their scales block by block (every buffer is whole blocks), the rest (codebooks, step)
    copied to each."""
    total, out = sum(numels), [{} for _ in numels]
    for key, v in state.items():
        if torch.is_tensor(v) and key.startswith(("state", "absmax")):
            per = 1 if key.startswith("state") else QUANT_BLOCK
            if v.numel() * per != total:
                raise ValueError(f"cannot resume: the optimizer state {key} ({v.numel()} values) does not lay out "
                                 f"a packed buffer of {total} elements")
            parts = [t.clone() for t in v.reshape(-1).split([n // per for n in numels])]
        elif isinstance(v, dict):  # bitsandbytes keeps its quantized states in a dict of their own
            parts = _cut(v, numels)
        else:
            parts = [v.clone() if torch.is_tensor(v) else v for _ in numels]
        for o, part in zip(out, parts):
            o[key] = part
    return out


Pack = tuple[torch.Tensor, list[torch.Tensor]]  # a tensor the optimizer keys its state by, and what it stands for


def _packs(groups: list[dict]) -> tuple[list[Pack], list[list[int]], list[dict]]:
    """The packs of `groups` (packed within a group: a pack steps with one group's settings, weight decay), how many
    buffers each group's (device, dtype) tensors make, and the groups as the optimizer steps them: their packs, then
    the tensors stepped alone. A pack's tensor is empty between steps (no memory kept)."""
    packs: list[Pack] = []
    cuts: list[list[int]] = []
    stepped = []
    for group in groups:
        same: dict[tuple, list[torch.Tensor]] = {}
        for p in group["params"]:
            if p.requires_grad and _packable(p):
                same.setdefault((p.device, p.dtype), []).append(p)
        runs = [(d, t, _runs(ps)) for (d, t), ps in same.items() if len(ps) > 1]
        mine = [(torch.empty(0, device=d, dtype=t), run) for d, t, rs in runs for run in rs]
        cuts.append([len(rs) for _, _, rs in runs])
        inside = {id(p) for _, ps in mine for p in ps}
        packs += mine
        stepped.append(group | {"params": [flat for flat, _ in mine] +
                                [p for p in group["params"] if id(p) not in inside]})
    return packs, cuts, stepped


def _cut_whole_packs(state_dict: dict[str, Any], cuts: list[list[int]], numels: list[int]) -> dict[str, Any]:
    """A state saved with one buffer per (device, dtype) (before the bound) as the states of today's buffers
    (`cuts`: per group, the buffers each whole one makes; `numels`: every buffer's elements, in order)."""
    left = iter(numels)
    old, state, groups, index = state_dict["state"], {}, [], 0
    for saved, cut in zip(state_dict["param_groups"], cuts):
        pieces: list[dict | None] = []
        for i, key in enumerate(saved["params"]):
            if i < len(cut):  # a whole buffer: its state cut as today's buffers cut its tensors
                parts = [next(left) for _ in range(cut[i])]
                pieces += _cut(old[key], parts) if key in old else [None] * len(parts)
            else:  # a tensor stepped alone
                pieces.append(old.get(key))
        groups.append(saved | {"params": list(range(index, index + len(pieces)))})
        state |= {index + j: piece for j, piece in enumerate(pieces) if piece is not None}
        index += len(pieces)
    return {"state": state, "param_groups": groups}


def packed(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """`cls` (a bitsandbytes optimizer) stepping its packable tensors as a few buffers per (device, dtype)."""

    class Packed(cls):
        def __init__(self, params: Params, **kw):
            params = list(params)
            groups = params if params and isinstance(params[0], dict) else [{"params": params}]
            self.packs, self.cuts, stepped = _packs(groups)
            self.sizes = [[p.numel() for p in ps] for _, ps in self.packs]
            super().__init__(stepped, **kw)
            packs = {id(flat) for flat, _ in self.packs}
            self.alone = [p for g in self.param_groups for p in g["params"] if id(p) not in packs]

        @torch.no_grad()
        def step(self, closure=None):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            # one buffer at a time: bitsandbytes steps what has a gradient, so every other buffer has none and the
            # tensors stepped alone have theirs back for the last call
            alone = [(p, p.grad) for p in self.alone if p.grad is not None]
            for p, _ in alone:
                p.grad = None
            for (flat, ps), sizes in zip(self.packs, self.sizes):
                flat.data = torch.cat([p.reshape(-1) for p in ps])
                # a tensor without a gradient this step is stepped with a zero one (peft's adapters always have one)
                flat.grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                       for p in ps])
                super().step()
                torch._foreach_copy_(ps, [v.view_as(p) for v, p in zip(flat.split(sizes), ps)])
                flat.data, flat.grad = flat.data.new_empty(0), None
            for p, g in alone:
                p.grad = g
            if alone:
                super().step()
            return loss

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            saved = [len(g["params"]) for g in state_dict["param_groups"]]
            whole = [len(g["params"]) - sum(c) + len(c) for g, c in zip(self.param_groups, self.cuts)]
            if saved != [len(g["params"]) for g in self.param_groups] and saved == whole:
                state_dict = _cut_whole_packs(state_dict, self.cuts, [sum(sizes) for sizes in self.sizes])
            super().load_state_dict(state_dict)

        def zero_grad(self, set_to_none: bool = True) -> None:
            super().zero_grad(set_to_none)
            for _, ps in self.packs:
                for p in ps:
                    if set_to_none:
                        p.grad = None
                    elif p.grad is not None:
                        p.grad.zero_()

    Packed.__name__ = Packed.__qualname__ = f"Packed{cls.__name__}"
    return Packed
