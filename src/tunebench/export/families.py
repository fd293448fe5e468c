"""What each model family's GGUF holds beyond its tensors' names: its llama.cpp architecture, its hyperparameter
keys, and the changes its weights need on the way, as llama.cpp's own converter (convert_hf_to_gguf.py) makes them.

llama.cpp rebuilds each architecture from these keys alone and fixes some of it in code (the Gemmas' pattern of
sliding-window layers, their local rotary base): a model that departs from what llama.cpp assumes is refused here,
since its GGUF would load and then compute another model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gguf
import torch

from tunebench.errors import UserError


@dataclass(frozen=True)
class Family:
    arch: gguf.MODEL_ARCH
    rotary_rows: bool = False  # Q and K rows reordered: HF's rotary halves -> llama.cpp's interleaved pairs
    norm_plus_one: bool = False  # Gemma's RMSNorm scales by (1 + w); llama.cpp's by w
    always_tied: bool = False  # the architecture has no output tensor: the head is the embedding
    keys: Callable[[dict[str, Any], gguf.GGUFWriter], None] | None = field(default=None)


def _gemma2_keys(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    _check_gemma(hp, 2)
    w.add_attn_logit_softcapping(float(hp.get("attn_logit_softcapping") or 0.0))
    w.add_final_logit_softcapping(float(hp.get("final_logit_softcapping") or 0.0))
    w.add_sliding_window(int(hp["sliding_window"]))


def _gemma3_keys(hp: dict[str, Any], w: gguf.GGUFWriter) -> None:
    _check_gemma(hp, 6)
    local = (hp.get("rope_parameters") or {}).get("sliding_attention") or {}
    theta = local.get("rope_theta", hp.get("rope_local_base_freq", 10000.0))
    if theta != 10000.0:  # llama.cpp's gemma3 gives its sliding layers this base, whatever the file says
        raise UserError(f"cannot export to GGUF: this Gemma 3's sliding layers use rotary base {theta}, llama.cpp "
                        "fixes it at 10000; export a model with the standard Gemma 3 layout")
    if hp.get("final_logit_softcapping") or hp.get("attn_logit_softcapping"):
        raise UserError("cannot export to GGUF: llama.cpp's gemma3 has no logit soft-capping, this model sets it")
    w.add_sliding_window(int(hp["sliding_window"]))


def _check_gemma(hp: dict[str, Any], every: int) -> None:
    """llama.cpp fixes a Gemma's layer pattern (every `every`-th layer global, the rest sliding) and scales
    attention by the head size: a model that says otherwise would run as another model there."""
    n = hp["num_hidden_layers"]
    expected = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]
    if hp.get("layer_types") not in (None, expected):
        raise UserError(f"cannot export to GGUF: this Gemma's layer_types are not llama.cpp's fixed pattern "
                        f"(every {every}th layer global); export a model with the standard layout")
    head_dim = _head_dim(hp)
    if hp.get("query_pre_attn_scalar", head_dim) != head_dim:
        raise UserError(f"cannot export to GGUF: query_pre_attn_scalar={hp['query_pre_attn_scalar']} differs from "
                        f"head_dim={head_dim}, which llama.cpp scales attention by; set them equal")


FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(gguf.MODEL_ARCH.LLAMA, rotary_rows=True),
    "MistralForCausalLM": Family(gguf.MODEL_ARCH.LLAMA, rotary_rows=True),  # llama.cpp runs Mistral as llama
    "Qwen2ForCausalLM": Family(gguf.MODEL_ARCH.QWEN2),
    "Qwen3ForCausalLM": Family(gguf.MODEL_ARCH.QWEN3),
    "GemmaForCausalLM": Family(gguf.MODEL_ARCH.GEMMA, norm_plus_one=True, always_tied=True),
    "Gemma2ForCausalLM": Family(gguf.MODEL_ARCH.GEMMA2, norm_plus_one=True, always_tied=True, keys=_gemma2_keys),
    "Gemma3ForCausalLM": Family(gguf.MODEL_ARCH.GEMMA3, norm_plus_one=True, keys=_gemma3_keys),
}


def family_of(hp: dict[str, Any]) -> tuple[str, Family]:
    """The family of a config.json's model, or a one-line refusal naming the supported ones."""
    names = hp.get("architectures") or []
    for name in names:
        if name in FAMILIES:
            return name, FAMILIES[name]
    shown = ", ".join(names) or f"model_type={hp.get('model_type')}"
    raise UserError(f"cannot export {shown} to GGUF: supported architectures are {', '.join(FAMILIES)}")


def _head_dim(hp: dict[str, Any]) -> int:
    return int(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])


def rope(hp: dict[str, Any]) -> dict[str, Any]:
    """The global (full-attention) layers' rotary parameters, from transformers 5's `rope_parameters` (per layer
    type where the model has two kinds) or the older `rope_theta` / `rope_scaling`."""
    params = hp.get("rope_parameters") or {}
    if "full_attention" in params:
        params = params["full_attention"]
    out = dict(hp.get("rope_scaling") or {}) | dict(params)
    out.setdefault("rope_theta", hp.get("rope_theta", 1e6 if "Gemma3ForCausalLM" in hp.get("architectures", [])
                                        else 10000.0))
    out["rope_type"] = out.get("rope_type") or out.get("type") or "default"
    return out


def write_keys(hp: dict[str, Any], fam: Family, w: gguf.GGUFWriter) -> None:
    """The hyperparameters llama.cpp reads for every one of these architectures, then the family's own."""
    heads = hp["num_attention_heads"]
    w.add_context_length(int(hp.get("max_position_embeddings") or 4096))
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_block_count(hp["num_hidden_layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(hp.get("num_key_value_heads") or heads)
    w.add_layer_norm_rms_eps(float(hp.get("rms_norm_eps", 1e-6)))
    w.add_vocab_size(hp["vocab_size"])
    head_dim = _head_dim(hp)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    r = rope(hp)
    w.add_rope_freq_base(float(r["rope_theta"]))
    kind = r["rope_type"]
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(r["factor"]))
    elif kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(r["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(r["original_max_position_embeddings"]))
    elif kind not in ("default", "llama3"):  # llama3's scaling goes as a tensor (rope_freqs), not as keys
        raise UserError(f"cannot export to GGUF: rotary scaling {kind!r} is not supported "
                        "(supported: default, linear, llama3, yarn)")
    if fam.keys is not None:
        fam.keys(hp, w)


def rope_freqs(hp: dict[str, Any]) -> torch.Tensor | None:
    """Llama 3.1's rotary scaling as llama.cpp takes it: one factor per rotary frequency (the `rope_freqs`
    tensor). High frequencies keep their factor 1, low ones are divided by `factor`, the band between blends."""
    r = rope(hp)
    if r["rope_type"] != "llama3":
        return None
    dim = _head_dim(hp)
    factor, low, high = float(r["factor"]), float(r.get("low_freq_factor", 1.0)), float(r.get("high_freq_factor", 4.0))
    old = float(r.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / (float(r["rope_theta"]) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def rotary_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """HF keeps each head's rotary pairs as two halves (rotate_half); llama.cpp's rope pairs neighbouring rows:
    within each head, row i of the first half and row i of the second become rows 2i and 2i+1."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def transform(name: str, t: torch.Tensor, hp: dict[str, Any], fam: Family) -> torch.Tensor:
    """The HF tensor `name` as llama.cpp's architecture computes with it."""
    if fam.rotary_rows and name.endswith(("q_proj.weight", "q_proj.bias")):
        return rotary_rows(t, hp["num_attention_heads"])
    if fam.rotary_rows and name.endswith(("k_proj.weight", "k_proj.bias")):
        return rotary_rows(t, hp.get("num_key_value_heads") or hp["num_attention_heads"])
    if fam.norm_plus_one and name.endswith("norm.weight"):
        return t + 1
    return t
