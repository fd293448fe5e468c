"""The model families tunebench knows, as plain data (no torch): what a block of each holds beyond its config's
shape keys. The parameter counts (models.count), the planner (tunebench.plan) and the engine's family-specific
choices (the loss's soft-capping, mixture-of-experts layers) read it from here.

Adding a family is one row of FAMILIES (and its config class in models.presets when it gets presets).

  decoder   Llama-style blocks: attention q, k, v, o; a gated MLP gate, up, down; RMSNorms
  gpt2      GPT-2: fused qkv with biases, learned positions, LayerNorms
Within `decoder`, what differs:
  fused       Phi-3: one qkv_proj and one gate_up_proj instead of q/k/v and gate/up
  qkv_bias    Qwen2: biases on q, k and v (none on o)
  qk_norm     Qwen3, Gemma 3: an RMSNorm over each head's query and key
  norms       RMSNorms per block: Gemma's sandwich norms are four (before and after attention and MLP)
  softcap     Gemma 2: attention logits and the output's logits soft-capped (c * tanh(x / c))
  biases      the config's bias keys the family's modules read (attention_bias, mlp_bias): others ignore them
  experts     mixture of experts: a router and E experts per sparse block, k of them per token; transformers 5
              stores each block's experts as two 3-D parameters (gate_up_proj E x 2I x h, down_proj E x h x I)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Family:
    name: str  # the config's model_type
    kind: Literal["decoder", "gpt2"] = "decoder"
    fused: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    norms: int = 2
    softcap: bool = False
    experts: bool = False
    biases: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return {"qwen3_moe": "Qwen3-MoE", "gemma3_text": "Gemma 3", "gpt2": "GPT-2", "phi3": "Phi-3"}.get(
            self.name, self.name.capitalize())


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", biases=("attention_bias", "mlp_bias")),
    Family("mistral"),
    Family("qwen2", qkv_bias=True),
    Family("qwen3", qk_norm=True, biases=("attention_bias",)),
    Family("gemma", norms=2, biases=("attention_bias",)),
    Family("gemma2", norms=4, softcap=True, biases=("attention_bias",)),
    Family("gemma3_text", norms=4, qk_norm=True, biases=("attention_bias",)),
    Family("phi3", fused=True),
    Family("mixtral", experts=True),
    Family("qwen3_moe", qk_norm=True, experts=True, biases=("attention_bias",)),
    Family("gpt2", kind="gpt2"),
)}


def family_of(shape: dict[str, Any]) -> Family | None:
    """The family of a config's keys (its model_type; a GPT-2 config may lack one), None when unknown."""
    kind = shape.get("model_type") or ("gpt2" if "n_layer" in shape else "llama")
    family = FAMILIES.get(kind)
    if family is None or (family.kind == "decoder" and "intermediate_size" not in shape
                          and "moe_intermediate_size" not in shape):
        return None
    return family


def known() -> str:
    """The known families, for messages."""
    return ", ".join(f.label for f in FAMILIES.values())


@dataclass(frozen=True)
class Experts:
    """A mixture-of-experts model's experts: `count` per sparse block, `active` of them per token, each an MLP of
    `width`; `sparse` of the model's blocks have them (the others a dense MLP)."""

    count: int
    active: int
    width: int
    sparse: int


def experts_of(shape: dict[str, Any], layers: int) -> Experts | None:
    """The experts of a mixture-of-experts config (Mixtral's and Qwen3-MoE's keys), None for a dense model."""
    family = family_of(shape)
    if family is None or not family.experts:
        return None
    count = shape.get("num_local_experts") or shape.get("num_experts")
    width = shape.get("moe_intermediate_size") or shape["intermediate_size"]
    dense = set(shape.get("mlp_only_layers") or [])
    step = shape.get("decoder_sparse_step") or 1
    sparse = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0) if family.name == "qwen3_moe" \
        else layers
    return Experts(int(count), int(shape["num_experts_per_tok"]), int(width), sparse)


def has_dense_mlp(shape: dict[str, Any], layers: int) -> bool:
    """Some block has a dense MLP (not every block a mixture of experts'): what a chunked MLP (mlp_chunk) needs."""
    ex = experts_of(shape, layers)
    return ex is None or ex.sparse < layers


def has_experts(shape: dict[str, Any]) -> bool:
    """A config of a mixture of experts, known here or not (transformers' keys for the expert count)."""
    return bool(shape.get("num_local_experts") or shape.get("num_experts") or shape.get("n_routed_experts"))


def refusal(shape: dict[str, Any], method: str, strategy: str) -> tuple[str, str, str] | None:
    """(field, value, why) where this model cannot run `method` under `strategy`, else None."""
    family = family_of(shape)
    if method != "qlora" or not has_experts(shape):
        return None
    if family is None or not family.experts:
        return ("method", method, f"QLoRA's 4-bit experts are tunebench's for {', '.join(QUANTIZED_EXPERTS)}; "
                                  f"{shape.get('model_type', 'this model')}'s are not among them (use method lora)")
    if strategy not in ("single", "ddp"):
        return ("strategy", strategy, f"QLoRA of a mixture of experts ({family.label}) runs under single or ddp: "
                                      "its 4-bit experts are tunebench's own layers, which FSDP2 and DeepSpeed do not "
                                      "shard")
    return None


QUANTIZED_EXPERTS = tuple(f.name for f in FAMILIES.values() if f.experts)  # whose experts models.experts4bit takes
