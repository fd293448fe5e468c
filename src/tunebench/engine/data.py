"""Seeded synthetic tokens generated on the device: no loader, no host-to-device copies per step."""

from __future__ import annotations

import torch


class SyntheticTokens:
    """Uniform random token ids; labels are the next token. Same seed, same batches on any run."""

    def __init__(self, vocab_size: int, batch_size: int, seq_len: int, device: torch.device, seed: int):
        self.shape = (batch_size, seq_len + 1)
        self.vocab_size = vocab_size
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device = device

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, self.vocab_size, self.shape, generator=self.gen, device=self.device)
        return ids[:, :-1], ids[:, 1:]
