"""Seeded synthetic tokens generated on the device: no loader, no host-to-device copies per step."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class Batch(NamedTuple):
    """One micro-batch: input ids, their next-token labels (-100: not trained on), and where rows pack several
    examples, their position ids and the examples' bounds in the rows flattened (`documents_of`; None: one
    sequence per row). Preference pairs: the chosen answers' rows then the rejected ones', with the reference
    model's log-probability of each answer where they were precomputed ((rows, pairs per row); engine.preference)."""

    ids: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor | None = None
    documents: torch.Tensor | None = None
    reference: torch.Tensor | None = None


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


PROMPT_SHARE = 4  # a synthetic pair's prompt: the first 1/PROMPT_SHARE of its rows (the answers, the rest)


class SyntheticPairs:
    """Preference pairs of uniform random tokens: each micro-batch is B pairs as 2B rows (the chosen answers' rows,
    then the rejected ones'), both answers of a pair after the same prompt, labels on the answers only. Every rank
    draws the same global batch and keeps its own pairs, as SyntheticTokens does. `reference`: the batch carries
    reference log-probabilities, as precomputed ones are (drawn near a uniform model's)."""

    def __init__(self, vocab_size: int, batch_size: int, seq_len: int, device: torch.device, seed: int,
                 rank: int = 0, world_size: int = 1, reference: bool = False):
        self.pairs, self.batch = batch_size * world_size, batch_size
        self.rows = slice(rank * batch_size, (rank + 1) * batch_size)
        self.seq_len, self.prompt = seq_len, max(1, seq_len // PROMPT_SHARE)
        self.vocab_size, self.reference = vocab_size, reference
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def next(self) -> Batch:
        shape = (2, self.pairs, self.seq_len + 1)
        ids = torch.randint(0, self.vocab_size, shape, generator=self.gen, device=self.device)[:, self.rows]
        ids[1, :, :self.prompt] = ids[0, :, :self.prompt]  # one prompt, two answers
        ids = ids.reshape(2 * self.batch, self.seq_len + 1)
        labels = ids[:, 1:].clone()
        labels[:, :self.prompt - 1] = -100  # the prompt's tokens are not trained on
        ref = None
        if self.reference:
            answer = self.seq_len - self.prompt + 1
            ref = -math.log(self.vocab_size) * answer + torch.randn(
                (2 * self.batch, 1), generator=self.gen, device=self.device)
        return Batch(ids[:, :-1], labels, reference=ref)
