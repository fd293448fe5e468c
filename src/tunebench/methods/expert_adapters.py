"""LoRA on a mixture of experts' expert weights, applied to the routed tokens instead of to the weights.

peft adapts a 3-D expert weight by rebuilding it at every pass (W + s B A for all E experts, under a
parametrization), and autograd then takes that whole rebuilt weight's gradient: two passes over every expert's
weight a step, and the rebuilt stack kept for backward, for a rank-r change. Here the same adapters (peft's
parameters, names and saved files) are applied as the linear layers' are: y = x W^T + s (x A^T) B^T, each expert's
tokens through their own A and B, as two more grouped GEMMs of rank r beside each expert projection. No
expert-sized tensor is built, and the frozen experts get no weight gradient.

Applied where transformers computes the experts as grouped GEMMs (its default), and to QLoRA's 4-bit experts
(models.experts4bit), whose packed weights peft could not rebuild; peft's own path stays elsewhere.
Other weights peft adapts as parameters (the routers under all-linear) are rebuilt as W + s B A, as peft does, but
inside the module's own forward instead of under a parametrization, which torch.compile cannot keep in one graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from tunebench.config.targets import EXPERT_WEIGHTS

NAME = "tunebench_grouped_lora"
# the experts implementations this one replaces: transformers' grouped GEMMs, and models.experts' (the same with
# fp32 weights cast under autocast, which this one does too)
GROUPED = ("grouped_mm", "tunebench_grouped_mm")
_WRAPPERS = "_tunebench_expert_adapters"  # on the experts module: peft's ParamWrappers around it (a plain list)
Factors = tuple[torch.Tensor, torch.Tensor, int, float]  # peft's lora_A and lora_B weights, experts, scaling


@torch.library.custom_op("tunebench::expert_factors", mutates_args=())
def expert_factors(a: torch.Tensor, b: torch.Tensor, experts: int, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """peft's factors of an adapted expert weight, lora_A (E r, in) and lora_B (out, r E), as the grouped GEMMs take
    them: A (E, R, in) and B (E, out, R) in `dtype`, contiguous, R the rank rounded up to a multiple of 8 with zeros
    (grouped GEMMs take strides of 16 bytes' multiples only; the padding adds nothing and takes no gradient). Expert
    e's delta weight is s B[e] A[e], in the (out, in) orientation the tokens see whichever way the module stores the
    weight. An op of its own: inductor keeps its outputs' layout, where it would fold a copy into a view of B
    that the grouped GEMM refuses (its experts' stride 1)."""
    rank, padded = _ranks(a, experts)
    out_a = a.new_zeros(experts, padded, a.shape[1], dtype=dtype)
    out_a[:, :rank] = a.reshape(experts, rank, -1)
    out_b = b.new_zeros(experts, b.shape[0], padded, dtype=dtype)
    out_b[:, :, :rank] = b.reshape(b.shape[0], rank, experts).permute(2, 0, 1)
    return out_a, out_b


def _ranks(a: torch.Tensor, experts: int) -> tuple[int, int]:
    """The adapter's rank, and that rounded up to a multiple of 8."""
    rank = a.shape[0] // experts
    return rank, -(-rank // 8) * 8


@expert_factors.register_fake
def _(a: torch.Tensor, b: torch.Tensor, experts: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    padded = _ranks(a, experts)[1]
    return (a.new_empty(experts, padded, a.shape[1], dtype=dtype), b.new_empty(experts, b.shape[0], padded,
                                                                               dtype=dtype))


def _factors_setup(ctx: Any, inputs: tuple, output: Any) -> None:
    a, b, experts, _ = inputs
    ctx.experts, ctx.rank, ctx.dtypes = experts, a.shape[0] // experts, (a.dtype, b.dtype)


def _factors_backward(ctx: Any, grad_a: torch.Tensor, grad_b: torch.Tensor) -> tuple:
    e, r = ctx.experts, ctx.rank
    ga = grad_a[:, :r].reshape(e * r, -1).to(ctx.dtypes[0])
    gb = grad_b[:, :, :r].permute(1, 2, 0).reshape(grad_b.shape[1], r * e).to(ctx.dtypes[1])
    return ga, gb, None, None


expert_factors.register_autograd(_factors_backward, setup_context=_factors_setup)


def _factors(wrapper: nn.Module, adapter: str) -> Factors:
    return (wrapper.lora_A[adapter].weight, wrapper.lora_B[adapter].weight, wrapper.num_experts,
            wrapper.scaling[adapter])


def _active_adapters(module: nn.Module) -> Iterator[tuple[nn.Module, str]]:
    """(wrapper, adapter name) of each adapter peft has active on `module`'s weights (none while it disables them
    or has merged them into the weights)."""
    for w in module.__dict__.get(_WRAPPERS, ()):
        if not (w.disable_adapters or w.merged):
            yield from ((w, adapter) for adapter in w.active_adapters if adapter in w.lora_A)


def _active(experts: nn.Module) -> dict[str, list[Factors]]:
    """Each adapted expert weight's active adapters."""
    out: dict[str, list[Factors]] = {}
    for w, adapter in _active_adapters(experts):
        out.setdefault(w.parameter_name, []).append(_factors(w, adapter))
    return out


def _project(experts: nn.Module, name: str, x: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor,
             adapters: list[Factors], dtype: torch.dtype) -> torch.Tensor:
    """One expert projection over tokens sorted by expert, its adapters added per expert."""
    from transformers.integrations.moe import _grouped_linear

    bias = getattr(experts, f"{name}_bias", None) if getattr(experts, "has_bias", False) else None
    y = _grouped_linear(x, getattr(experts, name).to(dtype), offsets,
                        bias=None if bias is None else bias.to(dtype)[ids], is_transposed=experts.is_transposed)
    return _plus_adapters(y, x, offsets, adapters)


def _plus_adapters(y: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, adapters: list[Factors]) -> torch.Tensor:
    """y (an expert projection of x, tokens sorted by expert) plus each adapter's s B[e] A[e] x, in x's dtype."""
    from transformers.integrations.moe import _grouped_linear

    for lora_a, lora_b, experts_count, scale in adapters:
        a, b = expert_factors(lora_a, lora_b, experts_count, x.dtype)
        low = _grouped_linear(x, a, offsets)  # (tokens, r): x A[e]^T
        y = y + scale * _grouped_linear(low, b, offsets)
    return y


PACKED_EXPERTS = "Experts4bit"  # models.experts4bit's class: QLoRA's 4-bit experts, a sibling layer (by name)


def _is_packed(module: nn.Module) -> bool:
    return any(c.__name__ == PACKED_EXPERTS for c in type(module).__mro__)


_PACKED_CLASSES: dict[type, type] = {}


def _adapted_packed_class(cls: type) -> type:
    """QLoRA's 4-bit experts class with the active adapters of each projection added on the routed tokens, as
    `_forward` adds them to 16-bit experts (its `project` is where models.experts4bit lets them in): the packed
    weights stay as they are, dequantized as before. One class for all such modules, as `_adapted_class`."""
    if cls in _PACKED_CLASSES.values():  # routed already
        return cls
    if cls not in _PACKED_CLASSES:
        def project(self: nn.Module, name: str, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
            return _plus_adapters(cls.project(self, name, x, offsets), x, offsets, _active(self).get(name, []))

        _PACKED_CLASSES[cls] = type(cls.__name__, (cls,), {"project": project, "__module__": cls.__module__})
    return _PACKED_CLASSES[cls]


@contextmanager
def shaped_for_peft(model: nn.Module) -> Iterator[None]:
    """peft sizes an expert weight's adapters from its shape, and a packed 4-bit weight's is its bytes': while this
    holds, each 4-bit expert weight tells peft its logical shape (E, out, in) where peft reads a partitioned
    weight's (its `ds_shape`, as under DeepSpeed ZeRO-3). Nothing else of the weight changes."""
    packed = [getattr(m, w) for m in model.modules() if _is_packed(m) for w in EXPERT_WEIGHTS]
    for p in packed:
        p.ds_shape = torch.Size(p.quant_state.shape)
    try:
        yield
    finally:
        for p in packed:
            del p.ds_shape


def _forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
             top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' grouped-GEMM experts (tokens sorted by expert, one GEMM per projection over all experts) with
    the active adapters of each projection; fp32 expert weights under autocast cast as models.experts casts them."""
    adapters = _active(self)  # none while peft disables them (a DPO reference): the base experts alone
    device = hidden_states.device.type
    first = "gate_up_proj" if self.has_gate else "up_proj"
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else getattr(self, first).dtype
    tokens, k = top_k_index.shape
    ids, order = torch.sort(top_k_index.reshape(-1))
    x = hidden_states.to(dtype)[order // k]
    # histc, not bincount: no host sync (and it takes float input on the CPU, as transformers does)
    counts = torch.histc(ids.float() if device in ("cpu", "mps") else ids.int(), bins=self.num_experts, min=0,
                         max=self.num_experts - 1)
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    h = _project(self, first, x, offsets, ids, adapters.get(first, []), dtype)
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)
    y = _project(self, "down_proj", h, offsets, ids, adapters.get("down_proj", []), dtype)
    y = y * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    out = y[back].view(tokens, k, -1).sum(dim=1)
    return out.to(hidden_states.dtype)


def _no_parametrization(*_: Any, **__: Any) -> nullcontext:
    return nullcontext()


class _Adapted:
    """A module seen with some of its weights replaced (everything else its own)."""

    def __init__(self, module: nn.Module, weights: dict[str, torch.Tensor]):
        self._module, self._weights = module, weights

    def __getattr__(self, name: str) -> Any:
        return self._weights[name] if name in self._weights else getattr(self._module, name)


def _adapted_weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """A small adapted weight (a router's): W + each active adapter's delta, as peft's parametrization builds it."""
    weights: dict[str, torch.Tensor] = {}
    for w, adapter in _active_adapters(module):
        base = weights.get(w.parameter_name, getattr(module, w.parameter_name))
        weights[w.parameter_name] = base + w.get_delta_weight(adapter)
    return weights


_ADAPTED_CLASSES: dict[type, type] = {}


def _adapted_class(cls: type) -> type:
    """`cls` whose forward sees its adapted weights: its own forward over a view of the module with them. One class
    for every module of `cls`, not a forward per module: torch.compile guards a per-module function by identity,
    and would trace each block again (up to its limit, then run the rest eagerly)."""
    if cls not in _ADAPTED_CLASSES:
        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            weights = _adapted_weights(self)
            return cls.forward(_Adapted(self, weights) if weights else self, *args, **kwargs)

        _ADAPTED_CLASSES[cls] = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})
    return _ADAPTED_CLASSES[cls]


def use_grouped_expert_adapters(model: nn.Module) -> int:
    """Route every adapted experts module of `model` (a peft model) through `_forward` (4-bit experts through
    `_adapted_packed_class`), and every other weight peft adapts as a parameter (a router's) through `_adapted_class`;
    the number of experts modules routed. No ParamWrapper parametrizes its weight any more (its `_activate_lora` does
    nothing): the modules read their adapters from those wrappers at each call, so merging, disabling and saving stay
    peft's."""
    from peft.tuners.lora.layer import ParamWrapper

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    # experts transformers runs another way (its eager loop) keep peft's rebuilt weights
    grouped = getattr(base.config, "_experts_implementation", None) in GROUPED
    outer = [m for m in model.modules() if isinstance(m, ParamWrapper)]
    inner = {id(m.base_layer) for m in outer}
    routed, implemented = 0, False
    for top in (m for m in outer if id(m) not in inner):
        chain, layer = [], top
        while isinstance(layer, ParamWrapper):
            chain.append(layer)
            layer = layer.base_layer
        experts = any(w.num_experts > 1 for w in chain)
        packed = _is_packed(layer)  # its own forward, whatever transformers' implementation
        if experts and not (grouped or packed):
            continue
        for w in chain:
            w._activate_lora = _no_parametrization
        layer.__dict__[_WRAPPERS] = chain
        if packed:
            layer.__class__ = _adapted_packed_class(type(layer))
        elif experts:
            implemented = True  # the experts implementation below reads them
        else:  # a router's 2-D weight, rebuilt in its own forward (peft's parametrization makes a new class at
            # every call, which torch.compile traces again at every step)
            layer.__class__ = _adapted_class(type(layer))
        routed += experts
    if implemented:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        ALL_EXPERTS_FUNCTIONS.register(NAME, _forward)  # registering again is harmless
        base.set_experts_implementation(NAME)
    return routed
