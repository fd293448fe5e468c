"""QLoRA's 4-bit base sharded by FSDP2: packed weights stored in the compute dtype, quantization state on the layer.

bitsandbytes keeps a 4-bit weight's quantization state (block scales, shape) on the weight tensor itself.
FSDP2 replaces every parameter with a DTensor shard and, in forward, with a plain all-gathered tensor: such
attributes do not survive. Here the packed bytes are stored as the compute dtype (bitsandbytes'
``quant_storage``), so FSDP's cast to that dtype is a no-op and the packed weight shards along dim 0 like any
other; the layer keeps the state itself (every rank a whole copy: about one byte per 64 weights with double
quantization) and hands it to the matmul.

The model is built on meta with these layers (``packed_placeholders``), sharded, and each rank then quantizes
every weight whole, one at a time, and keeps its rows of the packed bytes (``models.shards``): quantization is
deterministic, so the base is bit for bit the one an unsharded QLoRA build makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import bitsandbytes as bnb
import torch
from bitsandbytes.functional import quantize_4bit
from torch import nn

from tunebench.models.shards import Quantized, Slot

BLOCKSIZE = 64  # bitsandbytes' default for 4-bit weights


class ShardedLinear4bit(bnb.nn.Linear4bit):
    """A 4-bit linear whose quantization state lives on the layer, not on its (sharded, re-gathered) weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        out = bnb.matmul_4bit(x.to(self.compute_dtype), self.weight, bias=bias, quant_state=self.quant_state)
        return out.to(x.dtype)


def packed_rows(numel: int, storage: torch.dtype) -> int:
    """Rows of the (rows, 1) tensor bitsandbytes packs `numel` 4-bit weights into (two per byte)."""
    per_element = 2 * torch.empty((), dtype=storage).element_size()
    return (numel + 1) // per_element


def packed_placeholders(model: nn.Module, storage: torch.dtype) -> None:
    """Give every ShardedLinear4bit a meta weight of its packed shape in `storage`, which FSDP2 shards as it is.
    The weight keeps the attributes peft reads to wrap a 4-bit layer, and the shape it stands for."""
    for m in model.modules():
        if isinstance(m, ShardedLinear4bit):
            old = m.weight
            p = nn.Parameter(torch.empty(packed_rows(m.in_features * m.out_features, storage), 1, dtype=storage,
                                         device="meta"), requires_grad=False)
            p.quant_type, p.compress_statistics = old.quant_type, old.compress_statistics
            p.unpacked_shape = torch.Size((m.out_features, m.in_features))
            m.weight = p


def quantized_slots(slots: list[Slot], dtype: torch.dtype, storage: torch.dtype) -> list[Slot]:
    """`slots` with each ShardedLinear4bit weight made whole in `dtype`, quantized, packed into `storage`.
    Called before sharding: FSDP2's shards do not keep the placeholder's attributes."""
    return [replace(s, quantized=Quantized(torch.Size((s.module.out_features, s.module.in_features)), dtype,
                                           _quantizer(s.module, storage)))
            if isinstance(s.module, ShardedLinear4bit) and s.name == "weight" else s for s in slots]


def _quantizer(module: ShardedLinear4bit, storage: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """Quantize a whole (out, in) weight of `module`: keep its state on the layer, return the packed bytes."""
    quant_type, double = module.weight.quant_type, module.weight.compress_statistics

    def quantize(full: torch.Tensor) -> torch.Tensor:
        packed, state = quantize_4bit(full, blocksize=BLOCKSIZE, compress_statistics=double, quant_type=quant_type,
                                      quant_storage=storage)
        module.quant_state = state
        return packed

    return quantize
