"""Optimizer factory: PyTorch AdamW (foreach or fused) and bitsandbytes 8-bit / paged 8-bit AdamW.

bitsandbytes steps one tensor at a time and synchronizes the GPU after each (`sync_gpu`): with LoRA on every
linear layer of a 7B model that is 448 host round trips per step, the GPU idle through each of them
(benchmarks/results/qlora-lora.md). `packed` makes its step see the adapters as one tensor: their values and
gradients are gathered into one flat buffer per dtype, stepped by one call, and copied back. Its 8-bit states
are quantized in blocks of 256 elements, so a tensor whose size is a multiple of 256 (and above bitsandbytes'
8-bit minimum) gets exactly the update it would get alone; other tensors are stepped as before.

Weight decay (`param_groups`) skips biases, norms and embeddings, as docs/training.md states.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from tunebench.config import RunConfig

QUANT_BLOCK = 256  # bitsandbytes' blockwise 8-bit optimizer states: one scale per 256 elements
MIN_8BIT = 4096  # bitsandbytes' min_8bit_size: smaller tensors keep 32-bit states


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


def packed(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    """`cls` (a bitsandbytes optimizer) stepping its packable tensors as one per (device, dtype)."""

    class Packed(cls):
        def __init__(self, params: Params, **kw):
            params = list(params)
            groups = params if params and isinstance(params[0], dict) else [{"params": params}]
            self.packs: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
            stepped = []
            for group in groups:  # packed within a group: a pack steps with one group's settings (weight decay)
                same: dict[tuple, list[torch.Tensor]] = {}
                for p in group["params"]:
                    if p.requires_grad and _packable(p):
                        same.setdefault((p.device, p.dtype), []).append(p)
                # each pack: a tensor the optimizer keys its state by, empty between steps (no memory kept), and
                # the model's tensors it stands for
                packs = [(torch.empty(0, device=d, dtype=t), ps) for (d, t), ps in same.items() if len(ps) > 1]
                inside = {id(p) for _, ps in packs for p in ps}
                self.packs += packs
                stepped.append(group | {"params": [flat for flat, _ in packs] +
                                        [p for p in group["params"] if id(p) not in inside]})
            self.sizes = [[p.numel() for p in ps] for _, ps in self.packs]
            super().__init__(stepped, **kw)

        @torch.no_grad()
        def step(self, closure=None):
            for flat, ps in self.packs:
                flat.data = torch.cat([p.reshape(-1) for p in ps])
                # a tensor without a gradient this step is stepped with a zero one (peft's adapters always have one)
                flat.grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                       for p in ps])
            loss = super().step(closure)
            for (flat, ps), sizes in zip(self.packs, self.sizes):
                torch._foreach_copy_(ps, [v.view_as(p) for v, p in zip(flat.split(sizes), ps)])
                flat.data, flat.grad = flat.data.new_empty(0), None
            return loss

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
