"""Causal-LM loss computed in chunks of tokens, each chunk's logits recomputed in backward.

Hugging Face's loss materialises the whole (batch x seq x vocab) logits and upcasts them to fp32:
on Mistral-7B at batch 8 x 512 that is 0.8 GiB, plus as much again for its gradient. Here only one
chunk of about 64 Mi fp32 logits lives at a time; the price is one extra head forward per chunk
(about 2% of a 7B model's FLOPs), which the HFU figure counts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

LOGITS_PER_CHUNK = 1 << 26  # fp32 elements: 256 MiB


def chunk_tokens(vocab_size: int) -> int:
    return max(128, LOGITS_PER_CHUNK // vocab_size)


def _chunk_loss(head: nn.Module, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(h).float(), labels, reduction="sum")


def causal_lm_loss(hidden: torch.Tensor, head: nn.Module, labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Mean next-token cross-entropy; `labels` are already shifted (labels[i] follows input[i])."""
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    n = chunk_tokens(vocab_size)
    total = sum(checkpoint(_chunk_loss, head, h[i:i + n], y[i:i + n], use_reentrant=False)
                for i in range(0, h.shape[0], n))
    return total / y.numel()
