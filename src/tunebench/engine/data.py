"""Seeded synthetic tokens generated on the device: no loader, no host-to-device copies per step."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Batch(NamedTuple):
    """One micro-batch: input ids, their next-token labels (-100: not trained on), and position ids where
    rows pack several examples (None: one sequence per row)."""

    ids: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor | None = None


class SyntheticTokens:
    """Uniform random token ids; labels are the next token.

    Every rank draws the same global batch (batch_size x world_size rows) from the same seed and
    keeps its own slice, so a run on N ranks sees exactly the samples that one process with
    N times the batch sees: that is what makes losses comparable across strategies.
    """

    def __init__(self, vocab_size: int, batch_size: int, seq_len: int, device: torch.device, seed: int,
                 rank: int = 0, world_size: int = 1):
        self.shape = (batch_size * world_size, seq_len + 1)
        self.rows = slice(rank * batch_size, (rank + 1) * batch_size)
        self.vocab_size = vocab_size
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def next(self) -> Batch:
        ids = torch.randint(0, self.vocab_size, self.shape, generator=self.gen, device=self.device)[self.rows]
        return Batch(ids[:, :-1], ids[:, 1:])
