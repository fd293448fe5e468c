"""Model FLOPs per token, MFU and HFU, exactly as docs/metrics.md defines them.

Training where all weights get gradients: 6*N_matmul + 6*L*H*head_dim*S (PaLM appendix B,
torchtitan; the attention term is for causal attention, half of the full S x S product).
LoRA / QLoRA: the frozen base gets no weight gradient, so its matmuls cost forward + input-gradient:
4*N_frozen + 6*N_trainable + the same attention term.
MFU in the references' convention (PaLM's 6N + 12*L*H*head_dim*S, torchtitan, llm-foundry) counts the full
S x S attention product: `mfu_noncausal`, beside ours, so figures compare with theirs (higher by the attention
term's share).
HFU also counts what is computed again: with activation checkpointing each checkpointed block's forward
(2*N_blocks + 2*L*H*head_dim*S, times the share of blocks checkpointed), and, where the head cannot use
the fused loss (a LoRA-wrapped head), the chunked loss's second head forward (2*N_head).
A mixture of experts counts what one token multiplies by: its router, and k of the E experts of each sparse
block (their weights times k/E; their LoRA adapters too), so N is the active parameters' matmuls.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from tunebench.gpus import match


def peak_flops(gpu_name: str | None) -> float | None:
    """Dense bf16 FLOP/s of a GPU by the name its driver reports (tunebench.gpus); None when unknown."""
    gpu = match(gpu_name)
    return gpu.peak_flops if gpu else None


@dataclass(frozen=True)
class FlopsPerToken:
    model: float  # MFU numerator
    hardware: float  # HFU numerator (adds recompute)
    formula: str
    n_frozen: int
    n_trainable: int
    attention: float

    @property
    def model_noncausal(self) -> float:
        """The MFU numerator with the full (non-causal) attention product, as PaLM and torchtitan count it."""
        return self.model + self.attention

    def with_reference_forward(self) -> FlopsPerToken:
        """DPO's reference model run forward on every token too (work the objective needs: counted in MFU)."""
        extra = 2.0 * (self.n_frozen + self.n_trainable) + self.attention / 3
        return dataclasses.replace(self, model=self.model + extra, hardware=self.hardware + extra,
                                   formula=self.formula + "; the reference's forward 2*N_matmul + 2*L*H*head_dim*S")


EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def _numel(p) -> int:
    """Elements a weight stands for: a 4-bit one's unpacked shape, a ZeRO-3 partition's whole size."""
    qs = getattr(p, "quant_state", None)
    return int(qs.shape.numel()) if qs is not None else int(getattr(p, "ds_numel", p.numel()))


def _matmul_size(m: nn.Module) -> int:
    if _is_experts(m):
        return sum(_numel(getattr(m, n)) for n in EXPERT_WEIGHTS)
    # bitsandbytes Linear4bit packs its weight, so count from the declared shape.
    if hasattr(m, "in_features") and hasattr(m, "out_features"):
        return m.in_features * m.out_features
    return _numel(m.weight)  # transformers' Conv1D (GPT-2), a router's weight; ZeRO-3's whole size


def _is_experts(m: nn.Module) -> bool:
    """A mixture-of-experts block's expert weights (transformers' 3-D parameters, or models.experts4bit's)."""
    return isinstance(getattr(m, "num_experts", None), int) and all(
        isinstance(getattr(m, n, None), nn.Parameter) for n in EXPERT_WEIGHTS)


def _is_router(m: nn.Module) -> bool:
    """A mixture-of-experts block's router: a (experts x hidden) weight multiplied by every token."""
    return hasattr(m, "top_k") and isinstance(getattr(m, "weight", None), nn.Parameter) and m.weight.dim() == 2


def _is_matmul(m: nn.Module) -> bool:
    if hasattr(m, "base_layer"):  # a peft wrapper: its base layer and adapters are counted on their own
        return False
    return (isinstance(m, nn.Linear) or type(m).__name__ in ("Linear4bit", "Linear8bitLt", "Conv1D")
            or _is_experts(m) or _is_router(m))


def _active_shares(model: nn.Module) -> dict[int, float]:
    """Modules a token runs only k/E of (experts, and the adapters peft puts on them), by id: k/E."""
    config = getattr(model, "config", None)
    k = getattr(config, "num_experts_per_tok", None)
    shares: dict[int, float] = {}
    if not k:
        return shares
    for m in model.modules():
        if _is_experts(m):
            shares[id(m)] = k / m.num_experts
        elif hasattr(m, "base_layer") and isinstance(getattr(m, "num_experts", None), int) and m.num_experts > 1:
            for side in ("lora_A", "lora_B"):  # peft's ParamWrapper: one adapter per expert, stacked
                for linear in getattr(m, side, {}).values():
                    shares[id(linear)] = k / m.num_experts
    return shares


def flops_per_token(model: nn.Module, head: nn.Module, num_layers: int, num_heads: int, head_dim: int,
                    seq_len: int, recompute: float, head_recompute: bool = False) -> FlopsPerToken:
    """`recompute`: the fraction of blocks whose forward runs again in backward (activation checkpointing:
    1 for every block, 0.5 for every other one, 0 without)."""
    frozen = trainable = head_n = 0
    shares = _active_shares(model)
    for m in model.modules():
        if not _is_matmul(m):
            continue
        n = round(_matmul_size(m) * shares.get(id(m), 1.0))
        weight = getattr(m, "weight", None) if not _is_experts(m) else getattr(m, EXPERT_WEIGHTS[0])
        if weight.requires_grad:
            trainable += n
        else:
            frozen += n
        if m is head:
            head_n = n
    attn = 6.0 * num_layers * num_heads * head_dim * seq_len
    mfu_flops = 4.0 * frozen + 6.0 * trainable + attn
    if frozen == 0:
        formula = f"6*N_matmul + 6*L*H*head_dim*S = 6*{trainable} + 6*{num_layers}*{num_heads}*{head_dim}*{seq_len}"
    else:
        formula = (f"4*N_frozen + 6*N_trainable + 6*L*H*head_dim*S = 4*{frozen} + 6*{trainable} "
                   f"+ 6*{num_layers}*{num_heads}*{head_dim}*{seq_len}")
    hfu_flops = mfu_flops
    if recompute:
        hfu_flops += recompute * (2.0 * (frozen + trainable - head_n) + attn / 3)
        share = "" if recompute == 1 else f"{recompute:g} x "
        formula += f"; HFU adds block recompute {share}(2*N_blocks + 2*L*H*head_dim*S)"
    if head_recompute:
        hfu_flops += 2.0 * head_n
        formula += "; HFU adds the chunked loss's head recompute 2*N_head"
    return FlopsPerToken(mfu_flops, hfu_flops, formula, frozen, trainable, attn)


def utilization(flops_per_tok: float, tokens_per_s_per_gpu: float, peak: float | None) -> float | None:
    return None if peak is None else flops_per_tok * tokens_per_s_per_gpu / peak
