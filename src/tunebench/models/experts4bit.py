"""QLoRA's 4-bit experts: a mixture of experts' expert weights in NF4, dequantized as they compute.

transformers 5 stores each block's experts as two 3-D parameters (gate_up_proj E x 2I x h, down_proj E x h x I).
bitsandbytes' 4-bit layers replace nn.Linear modules only, so a model loaded for QLoRA by transformers keeps its
experts in bf16: nearly all of an MoE's weights (Mixtral-8x7B's 90 GB of 93). Here each of the two is quantized with
bitsandbytes' blockwise NF4 (Params4bit over the whole tensor: 64-element blocks, double quantization as
configured), and the experts compute as transformers' grouped-GEMM implementation does (tokens sorted by expert,
one grouped matmul per projection, weighted, put back in order and summed over the k experts), each projection one
autograd function that dequantizes its weight in forward and again in backward and keeps nothing of it, as a QLoRA
linear layer does (bitsandbytes' MatMul4Bit). The frozen experts get no gradient; their input does.

The dequantization is models.nf4's (one Triton kernel on a GPU, torch ops elsewhere), so a compiled block traces it.
In a block whose checkpoint a compiled graph traces (engine.recompute.recompute_traced) the projections are plain
ops instead (`recomputed`, as models.nf4's layers there): what runs inside an autograd function is not marked for
recompute, so the partitioner kept every block's expert activations through the forward.
"""

from __future__ import annotations

import torch
from torch import nn

from tunebench.models import nf4
from tunebench.models.families import QUANTIZED_EXPERTS

WEIGHTS = ("gate_up_proj", "down_proj")


def is_experts(module: nn.Module) -> bool:
    """transformers' experts module of a mixture-of-experts block of the families these layers were built for
    (models.families: Mixtral's, Qwen3-MoE's): E experts' gated MLPs as two 3-D parameters. Others' experts (their
    own gates, limits, biases) are left as transformers has them."""
    config = getattr(module, "config", None)
    if getattr(config, "model_type", None) not in QUANTIZED_EXPERTS:
        return False
    return (isinstance(getattr(module, "num_experts", None), int) and all(
        isinstance(getattr(module, n, None), torch.Tensor) and getattr(module, n).dim() == 3 for n in WEIGHTS)
        and not getattr(module, "has_bias", False) and not getattr(module, "is_transposed", False))


def _grouped(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x (S, in) by each group's expert weight w (E, out, in), rows grouped by `offsets`: transformers' dispatcher
    (torch's grouped GEMM where it runs, else its fallback)."""
    from transformers.integrations.moe import _grouped_mm

    return _grouped_mm(x, w.transpose(-2, -1), offsets)


def _fusable(p: torch.Tensor) -> bool:
    """Packed as models.nf4 reads it: bytes, whole blocks, bitsandbytes' nested block of 256."""
    qs = p.quant_state
    return (p.dtype == torch.uint8 and qs.shape.numel() % qs.blocksize == 0
            and (not qs.nested or qs.state2.blocksize == nf4.NESTED_BLOCK))


def _state(p: torch.Tensor) -> tuple:
    """The packed bytes and their quantization state as models.nf4's dequantization takes them, but for the dtype:
    (packed, absmax, code, blocksize, shape, absmax_code, absmax_scale, offset)."""
    qs = p.quant_state
    nested = (qs.state2.code, qs.state2.absmax, qs.offset) if qs.nested else (None, None, None)
    return (p.data, qs.absmax, qs.code, qs.blocksize, tuple(qs.shape), *nested)


def _dequantized(state: tuple, dtype: torch.dtype, again: bool = False) -> torch.Tensor:
    """The (E, out, in) weight of `_state` in `dtype`."""
    return nf4._dequantize(*state[:5], dtype, *state[5:], again=again)


class _Grouped4bit(torch.autograd.Function):
    """x (S, in) by each group's dequantized expert weight; only the packed weight is kept for backward."""

    @staticmethod
    def forward(ctx, x, offsets, packed, absmax, code, blocksize: int, shape, absmax_code, absmax_scale, offset):
        ctx.save_for_backward(offsets, packed, absmax, code, absmax_code, absmax_scale, offset)
        ctx.meta = (blocksize, shape)
        return _grouped(x, _dequantized((packed, absmax, code, blocksize, shape, absmax_code, absmax_scale, offset),
                                        x.dtype), offsets)

    @staticmethod
    def backward(ctx, grad):
        offsets, packed, absmax, code, absmax_code, absmax_scale, offset = ctx.saved_tensors
        blocksize, shape = ctx.meta
        w = _dequantized((packed, absmax, code, blocksize, shape, absmax_code, absmax_scale, offset), grad.dtype,
                         again=True)  # (E, out, in): grad (S, out) -> (S, in)
        return (_grouped(grad, w.transpose(-2, -1), offsets),) + (None,) * 9


def _project(x: torch.Tensor, offsets: torch.Tensor, p: torch.Tensor, recomputed: bool = False) -> torch.Tensor:
    if _fusable(p) and recomputed:  # plain ops: the traced checkpoint dequantizes again in backward
        return _grouped(x, _dequantized(_state(p), x.dtype), offsets)
    if _fusable(p):
        return _Grouped4bit.apply(x, offsets, *_state(p))
    import bitsandbytes.functional as bf  # other packings: bitsandbytes' dequantization, kept by autograd

    return _grouped(x, bf.dequantize_4bit(p.data, p.quant_state).to(x.dtype), offsets)


class Experts4bit(nn.Module):
    """A block's experts with 4-bit weights; the forward of transformers' grouped-GEMM experts implementation."""

    def __init__(self, experts: nn.Module, compute_dtype: torch.dtype):
        super().__init__()
        self.num_experts = experts.num_experts
        self.act_fn = experts.act_fn
        self.compute_dtype = compute_dtype
        self.recomputed = False  # its block's checkpoint is traced by compile (mark_recomputed)
        self._gate = type(experts)._apply_gate  # [gate; up] split and gated as the model's own class does
        for name in WEIGHTS:  # placeholders on meta until made (models.build), or quantized from real values
            setattr(self, name, nn.Parameter(getattr(experts, name).detach(), requires_grad=False))

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._gate(self, gate_up)

    def project(self, name: str, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Expert weight `name` over tokens sorted by expert (`offsets`: each group's end); LoRA's experts add their
        adapters here (methods.expert_adapters)."""
        return _project(x, offsets, getattr(self, name), self.recomputed)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        k, tokens, width = top_k_index.shape[-1], hidden_states.shape[0], hidden_states.shape[-1]
        experts, order = torch.sort(top_k_index.reshape(-1))
        x = hidden_states[order // k].to(self.compute_dtype)
        # tokens per expert (histc: a fixed-size result, as transformers counts them; it takes no integers on the CPU)
        counts = torch.histc(experts.float() if experts.device.type == "cpu" else experts.int(), bins=self.num_experts,
                             min=0, max=self.num_experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        h = self._apply_gate(self.project("gate_up_proj", x, offsets))
        out = self.project("down_proj", h, offsets) * top_k_weights.reshape(-1)[order].unsqueeze(-1)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        return out[back].view(tokens, k, width).sum(dim=1).to(hidden_states.dtype)


def mark_recomputed(block: nn.Module, recomputed: bool) -> None:
    """The 4-bit experts of `block` as plain ops where its checkpoint is traced by compile (module doc)."""
    for m in block.modules():
        if isinstance(m, Experts4bit):
            m.recomputed = recomputed


def packed_weight(full: torch.Tensor, quant: str, double_quant: bool, storage: torch.dtype = torch.uint8):
    """`full` (any shape, the compute dtype) as bitsandbytes' Params4bit, quantized where it lives."""
    import bitsandbytes as bnb

    return bnb.nn.Params4bit(full, requires_grad=False, quant_type=quant, compress_statistics=double_quant,
                             quant_storage=storage).to(full.device)


def quantize_experts(model: nn.Module, compute_dtype: torch.dtype, quant: str, double_quant: bool) -> int:
    """Every experts module of a model whose weights are real (a checkpoint loaded in bf16) as Experts4bit, one
    module at a time (its bf16 weights freed before the next is quantized); returns how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        if not is_experts(module):
            continue
        q = Experts4bit(module, compute_dtype)
        for w in WEIGHTS:
            setattr(q, w, packed_weight(getattr(module, w).detach().to(compute_dtype), quant, double_quant))
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, q)
        swapped += 1
    return swapped
