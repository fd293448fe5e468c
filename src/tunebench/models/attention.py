"""SDPA that keeps its causal kernel when the whole model is compiled.

Traced by torch.compile, transformers always builds a dense mask: position ids might be packed and it cannot
look at their values without breaking the graph. A dense mask makes SDPA compute every query-key pair:
GPT-2's attention took 2.5x as long under whole-model compile on an H200 (benchmarks/RESULTS.md). The caller
knows better: rows of whole sequences (no position ids given, no padding mask) are plainly causal. This is
transformers' SDPA, registered under its own name with transformers' own mask, plus one keyword,
`plain_causal`, with which the caller drops the mask and SDPA runs with is_causal (its flash kernels);
inductor then removes the unused mask from the graph.
"""

from __future__ import annotations

from typing import Any

NAME = "sdpa_causal"


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, plain_causal: bool = False,
               **kwargs: Any) -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, None if plain_causal else attention_mask, **kwargs)


def sdpa_causal() -> str:
    """Register the attention (registering again is harmless) and return its name for `attn_implementation`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # packed rows and padding keep their masks
    return NAME
