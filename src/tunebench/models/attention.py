"""SDPA that keeps its causal kernel when the whole model is compiled.

Traced by torch.compile, transformers always builds a dense mask: position ids might be packed and it cannot
look at their values without breaking the graph. A dense mask makes SDPA compute every query-key pair:
GPT-2's attention took far longer under whole-model compile (benchmarks/results/full-finetune.md). The caller
knows better: rows of whole sequences (no position ids given, no padding mask) are plainly causal. This is
transformers' SDPA, registered under its own name with transformers' own mask, plus one keyword,
`plain_causal`, with which the caller drops the mask and SDPA runs with is_causal (its flash kernels);
inductor then removes the unused mask from the graph.

Grouped keys and values (Llama-3, Mistral, Qwen) in fp32 on a GPU are repeated to the query's heads first:
transformers asks SDPA to group them itself, which CUDA's flash and cuDNN kernels do only for 16-bit inputs and
its memory-efficient kernel (the one that takes fp32) not at all, so SDPA fell to its math kernel and kept every
S x S probability for backward: memory quadratic in the sequence length, per head and layer.

Packed rows (several examples per row, kept apart by position ids) get a second keyword, `documents`: where each
example starts in the rows flattened (engine.data.documents_of). With it, 16-bit attention on a GPU runs torch's
variable-length flash kernel, each example causal over itself alone: the block-diagonal mask transformers builds
kept SDPA off its flash kernels and computed every pair across examples only to mask it away
(benchmarks/probes/packed_attention.py times both). fp32 (no flash kernel takes it), dropout, sliding windows
shorter than the row and position biases keep the mask.
"""

from __future__ import annotations

import inspect
import math
import os
from typing import Any

NAME = "sdpa_causal"


def repeats_kv(query: Any) -> bool:
    """No kernel of SDPA but the math one groups keys for this query: fp32 on a GPU."""
    return query.is_cuda and query.element_size() == 4


def _varlen_parameters() -> frozenset[str]:
    """The keywords torch's varlen_attn takes (none: this torch has no varlen_attn, or `TUNEBENCH_VARLEN=0` turns
    it off, to measure it against the mask); they changed between releases (2.11: is_causal; later: window_size)."""
    if os.environ.get("TUNEBENCH_VARLEN", "1") == "0":
        return frozenset()
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


# read once where the attention is registered (a function under torch.compile must not ask the driver or inspect):
_flash_gpu = False  # whether this machine's GPU runs flash kernels (Ampere or later)
_varlen_names: frozenset[str] = frozenset()  # varlen_attn's keywords


def varlen_runs(query: Any) -> bool:
    """Whether torch's variable-length flash kernel takes this query: 16-bit, on an Ampere or later GPU."""
    import torch

    return (_flash_gpu and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16)
            and query.shape[-1] <= 256 and bool(_varlen_names))


def varlen_attention(query: Any, key: Any, value: Any, documents: Any, scale: float | None = None) -> Any:
    """Causal attention within each example of packed rows. query (B, H, S, D), key and value (B, Hkv, S, D);
    `documents`: the examples' start offsets in the B*S tokens, then B*S (padding entries of B*S are examples of
    length 0). Returns (B, S, H, D), as transformers' attention functions do."""
    from torch.nn.attention.varlen import varlen_attn

    b, h, s, d = query.shape
    hkv = key.shape[1]
    q = query.transpose(1, 2).reshape(b * s, h, d)
    k = key.transpose(1, 2).reshape(b * s, hkv, d)
    v = value.transpose(1, 2).reshape(b * s, hkv, d)
    names = _varlen_names
    options: dict[str, Any] = {"is_causal": True} if "is_causal" in names else {"window_size": (-1, 0)}
    if hkv != h and "enable_gqa" in names:
        options["enable_gqa"] = True
    elif hkv != h:  # grouped keys repeated to the query's heads: what the kernel then sees
        k, v = (t.repeat_interleave(h // hkv, dim=1) for t in (k, v))
    if scale is not None and "scale" in names:
        options["scale"] = scale
    elif scale is not None:  # the kernel scales by 1/sqrt(D): the rest goes into the query
        q = q * (scale * math.sqrt(d))
    # every example is at most one row long: the row bounds the kernel's grid, so no length is read from the GPU
    return varlen_attn(q, k, v, documents, documents, s, s, **options).view(b, s, h, d)


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, plain_causal: bool = False,
               documents: Any = None, **kwargs: Any) -> Any:
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    window = kwargs.get("sliding_window")  # Mistral's 4096 reaches no further than rows that long
    if (documents is not None and not kwargs.get("dropout") and (window is None or window >= query.shape[2])
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
            and getattr(module, "is_causal", True) and query.shape[2] == key.shape[2] and varlen_runs(query)):
        return varlen_attention(query, key, value, documents, kwargs.get("scaling")), None
    # a sliding window shorter than the keys (Gemma's local layers, Mistral v0.1's 4,096) keeps its mask: causal alone
    # would let every query see the whole row
    mask = None if plain_causal and (window is None or window >= key.shape[2]) else attention_mask
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1 and mask is None and repeats_kv(query):  # with a mask transformers repeats them itself
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def sdpa_causal() -> str:
    """Register the attention (registering again is harmless) and return its name for `attn_implementation`."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    global _flash_gpu, _varlen_names
    _flash_gpu = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
    _varlen_names = _varlen_parameters()
    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # packed rows and padding keep their masks
    return NAME
