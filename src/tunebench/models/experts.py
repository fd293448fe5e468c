"""A mixture of experts' experts under autocast: transformers' grouped-GEMM implementation with the weights cast.

torch's grouped GEMM takes no autocast, so transformers casts the tokens to the experts' weights' dtype: with fp32
master weights under bf16 autocast (full fine-tuning under single or ddp) every expert's matmuls ran in fp32, on
the CUDA cores. Registered as its own experts implementation, this one casts the weights to the autocast dtype
(a differentiable cast: their fp32 gradients come back through it), as autocast casts a linear layer's weight,
and is transformers' own otherwise (no autocast, 16-bit weights, 4-bit experts).
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "tunebench_grouped_mm"
CAST = ("gate_up_proj", "down_proj", "up_proj", "gate_up_proj_bias", "down_proj_bias", "up_proj_bias")


class _Cast:
    """The experts module seen with its floating-point weights in `dtype` (everything else its own)."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype):
        self._module, self._dtype = module, dtype

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if name in CAST and isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(self._dtype)
        return value


def _forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
             top_k_weights: torch.Tensor) -> torch.Tensor:
    from transformers.integrations.moe import grouped_mm_experts_forward

    device = hidden_states.device.type
    if torch.is_autocast_enabled(device) and self.gate_up_proj.dtype == torch.float32:
        dtype = torch.get_autocast_dtype(device)
        out = grouped_mm_experts_forward(_Cast(self, dtype), hidden_states.to(dtype), top_k_index, top_k_weights)
        return out.to(hidden_states.dtype)
    return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)


def use_autocast_experts(model: torch.nn.Module) -> None:
    """A mixture-of-experts model (one whose config has an experts implementation) computes its experts as above."""
    config = getattr(model, "config", None)
    if getattr(config, "_experts_implementation", None) != "grouped_mm":
        return  # a dense model, or experts transformers cannot run grouped here (its eager loop casts per expert)
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(NAME, _forward)  # registering again is harmless
    model.set_experts_implementation(NAME)
