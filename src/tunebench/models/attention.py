"""SDPA that keeps its causal kernel when the whole model is compiled.

Traced by torch.compile, transformers always builds a dense mask: position ids might be packed and it cannot
look at their values without breaking the graph. A dense mask makes SDPA compute every query-key pair:
GPT-2's attention took 2.5x as long under whole-model compile on an H200 (benchmarks/RESULTS.md). The caller
knows better: rows of whole sequences (no position ids given, no padding mask) are plainly causal. This is
transformers' SDPA, registered under its own name with transformers' own mask, plus one keyword,
`plain_causal`, with which the caller drops the mask and SDPA runs with is_causal (its flash kernels);
inductor then removes the unused mask from the graph.

Grouped keys and values (Llama-3, Mistral, Qwen) in fp32 on a GPU are repeated to the query's heads first:
transformers asks SDPA to group them itself, which CUDA's flash and cuDNN kernels do only for 16-bit inputs and
its memory-efficient kernel (the one that takes fp32) not at all, so SDPA fell to its math kernel and kept every
S x S probability for backward (Llama-3.2-1B fp32, s2048 b2 on an H100: 43.95 GiB; benchmarks/RESULTS.md).
"""

from __future__ import annotations

from typing import Any

NAME = "sdpa_causal"


def repeats_kv(query: Any) -> bool:
    """No kernel of SDPA but the math one groups keys for this query: fp32 on a GPU."""
    return query.is_cuda and query.element_size() == 4


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, plain_causal: bool = False,
               **kwargs: Any) -> Any:
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    mask = None if plain_causal else attention_mask
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1 and mask is None and repeats_kv(query):  # with a mask transformers repeats them itself
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def sdpa_causal() -> str:
    """Register the attention (registering again is harmless) and return its name for `attn_implementation`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # packed rows and padding keep their masks
    return NAME
