"""Seeded synthetic tokens generated on the device: no loader, no host-to-device copies per step."""

from __future__ import annotations

from typing import NamedTuple

import torch


class Batch(NamedTuple):
    """One micro-batch: input ids, their next-token labels (-100: not trained on), and where rows pack several
    examples, their position ids and the examples' bounds in the rows flattened (`documents_of`; None: one
    sequence per row)."""

    ids: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor | None = None
    documents: torch.Tensor | None = None


def documents_of(positions: torch.Tensor, capacity: int | None) -> torch.Tensor:
    """Where each example starts in the (B, S) rows flattened, then B*S: the cumulative offsets variable-length
    attention takes (int32). An example starts where its position is 0, and at every row's start.

    `capacity`: the offsets are padded with B*S (examples of length 0) to capacity + 1 entries, so every batch of
    a job has the same shape and a compiled graph is traced once; None: no padding."""
    b, s = positions.shape
    starts = positions.reshape(-1) == 0
    starts[::s] = True
    bounds = torch.cat([starts.nonzero().reshape(-1), torch.tensor([b * s], device=positions.device)])
    if capacity is not None:
        if len(bounds) > capacity + 1:
            raise ValueError(f"{len(bounds) - 1} examples in a batch whose capacity is {capacity}")
        bounds = torch.cat([bounds, bounds.new_full((capacity + 1 - len(bounds),), b * s)])
    return bounds.to(torch.int32)


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
