"""Prepared rows served to the training loop, one micro-batch at a time, resumably.

Every rank walks the same seeded order of rows (a new permutation each epoch) and takes its own slice of
each global micro-batch, so N ranks see what one process with N times the batch sees. The position (epoch,
micro-batches taken) is all a checkpoint needs to continue exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from tunebench.data.prepare import Prepared, fullest_row_of
from tunebench.data.rows import IGNORE
from tunebench.engine.data import Batch, documents_of
from tunebench.errors import UserError


@dataclass
class Position:
    epoch: int = 0
    micro: int = 0  # global micro-batches taken in this epoch


def _to(device: torch.device, a: np.ndarray | torch.Tensor) -> torch.Tensor:
    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a)).long()
    # pinned, so the copy does not make the host wait for the GPU's queue
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def _rows(a: np.ndarray) -> np.ndarray:
    """Preference pairs' (B, 2, S) rows as the (2B, S) batch a step takes: the chosen answers' rows, then the
    rejected answers' (engine.preference); (B, S) rows as they are."""
    return a.transpose(1, 0, 2).reshape(-1, a.shape[-1]) if a.ndim == 3 else a


def _batch(device: torch.device, ids: np.ndarray, labels: np.ndarray, positions: np.ndarray | None,
           examples: int, reference: np.ndarray | None = None) -> Batch:
    """Rows onto the device; packed rows with their position ids and their examples' bounds (padded to
    `examples`, the job's capacity, so every batch has one shape); pairs with their reference log-probabilities
    where they were precomputed."""
    ref = None if reference is None else _to(device, torch.from_numpy(_rows(np.asarray(reference))).float())
    ids, labels = _rows(ids), _rows(labels)
    if positions is None:
        return Batch(_to(device, ids), _to(device, labels), reference=ref)
    pos = torch.from_numpy(np.ascontiguousarray(_rows(positions))).long()
    return Batch(_to(device, ids), _to(device, labels), _to(device, pos), _to(device, documents_of(pos, examples)),
                 ref)


def capacity(prepared: Prepared, batch_size: int) -> int:
    """Examples a packed micro-batch holds at most (its examples' bounds are padded to this): both answers' rows of
    every pair."""
    return fullest_row_of(prepared) * batch_size * (2 if prepared.stats.get("shape") == "preference" else 1)


class DatasetBatches:
    def __init__(self, prepared: Prepared, batch_size: int, device: torch.device, seed: int, rank: int = 0,
                 world_size: int = 1, start: Position | None = None, reference: np.ndarray | None = None):
        self.ids, self.labels, self.positions = prepared.arrays()
        self.reference = reference  # (pairs, 2, per row): the reference's precomputed log-probabilities
        self.batch, self.rank, self.global_batch = batch_size, rank, batch_size * world_size
        self.per_epoch = len(self.ids) // self.global_batch  # micro-batches per epoch (a partial one is dropped)
        if self.per_epoch == 0:
            raise UserError(f"invalid batch_size={batch_size}: the data has {len(self.ids)} rows of seq_len "
                            f"{prepared.stats['seq_len']}, fewer than one global batch of {self.global_batch}")
        self.device, self.seed = device, seed
        self.examples = 0 if self.positions is None else capacity(prepared, batch_size)
        self.pos = start or Position()
        self._order = self._permutation(self.pos.epoch)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + epoch).permutation(len(self.ids))

    def next(self) -> Batch:
        if self.pos.micro >= self.per_epoch:
            self.pos = Position(self.pos.epoch + 1, 0)
            self._order = self._permutation(self.pos.epoch)
        first = self.pos.micro * self.global_batch + self.rank * self.batch
        rows = np.sort(self._order[first:first + self.batch])  # sorted: memory-mapped reads go forward
        self.pos = Position(self.pos.epoch, self.pos.micro + 1)
        return _batch(self.device, self.ids[rows], self.labels[rows],
                      None if self.positions is None else self.positions[rows], self.examples,
                      None if self.reference is None else self.reference[rows])


def eval_batches(prepared: Prepared, batch_size: int, device: torch.device, rank: int = 0, world_size: int = 1,
                 limit: int | None = None, reference: np.ndarray | None = None) -> Iterator[Batch]:
    """This rank's share of the validation rows, in order (at most `limit` batches per rank). Every rank runs as many
    batches: a shorter share repeats its last row with no label (sharded weights are gathered in every forward, so a
    rank with one batch fewer would leave the others waiting)."""
    ids, labels, positions = prepared.arrays()
    examples = 0 if positions is None else capacity(prepared, batch_size)
    share = list(range(rank, len(ids), world_size))
    real = len(share)
    share += [share[-1] if share else 0] * (-(-len(ids) // world_size) - real)
    for n, i in enumerate(range(0, len(share), batch_size)):
        if limit is not None and n >= limit:
            return
        rows = np.asarray(share[i:i + batch_size])
        kept = np.array(labels[rows])
        kept[np.arange(i, i + len(rows)) >= real] = IGNORE  # a repeated row counts nothing
        yield _batch(device, ids[rows], kept, None if positions is None else positions[rows], examples,
                     None if reference is None else reference[rows])
