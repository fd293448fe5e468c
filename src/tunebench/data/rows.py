"""Examples into seq_len rows: input ids, next-token labels and position ids.

Labels are the next token of the same example where that token is trained on, else -100 (ignored), so no
example predicts into the next one. Packed rows restart position ids at every example: with SDPA and
eager attention transformers then masks attention to stay inside each example (a block-diagonal causal
mask), with flash-attention-2 it uses the variable-length kernel: no attention crosses examples. The rest
of a row is padding with labels -100.

Text longer than a row is split into row-sized pieces (every token still trains). Pairs and chat longer than
a row are truncated, and dropped when nothing trainable is left.
"""

from __future__ import annotations

from dataclasses import dataclass, field

IGNORE = -100


@dataclass
class Rows:
    ids: list[list[int]] = field(default_factory=list)
    labels: list[list[int]] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    examples: int = 0  # examples read
    truncated: int = 0  # pairs/chat cut at seq_len
    split: int = 0  # text examples longer than a row, split into pieces
    dropped: int = 0  # examples with nothing trainable left (empty, or their trained part cut off)
    tokens: int = 0  # real (non-padding) tokens in the rows
    trained_tokens: int = 0  # tokens with a label


def _labels(ids: list[int], mask: list[bool]) -> list[int]:
    return [ids[j + 1] if mask[j + 1] else IGNORE for j in range(len(ids) - 1)] + [IGNORE]


def pieces(ids: list[int], mask: list[bool], seq_len: int, split: bool, out: Rows) -> list[tuple[list, list]]:
    """The example as (ids, labels) pieces of at most seq_len tokens (split for text, truncated otherwise)."""
    out.examples += 1
    if len(ids) > seq_len:
        if split:
            out.split += 1
            chunks = [(ids[i:i + seq_len], mask[i:i + seq_len]) for i in range(0, len(ids), seq_len)]
            return [(c, _labels(c, m)) for c, m in chunks if len(c) > 1]
        out.truncated += 1
        ids, mask = ids[:seq_len], mask[:seq_len]
    labels = _labels(ids, mask)
    if all(x == IGNORE for x in labels):
        out.dropped += 1
        return []
    return [(ids, labels)]


def lay_out(items: list[tuple[list, list]], seq_len: int, pad: int, pack: bool, out: Rows) -> Rows:
    """Pieces into rows: several per row in order when packing (next fit), else one per row, padded."""
    row_ids: list[int] = []
    row_labels: list[int] = []
    row_pos: list[int] = []

    def close() -> None:
        if row_ids:
            n = seq_len - len(row_ids)
            out.ids.append(row_ids + [pad] * n)
            out.labels.append(row_labels + [IGNORE] * n)
            out.positions.append(row_pos + list(range(n)))

    for ids, labels in items:
        if not pack or len(row_ids) + len(ids) > seq_len:
            close()
            row_ids, row_labels, row_pos = [], [], []
        row_ids, row_labels, row_pos = row_ids + ids, row_labels + labels, row_pos + list(range(len(ids)))
        out.tokens += len(ids)
        out.trained_tokens += sum(x != IGNORE for x in labels)
    close()
    return out


Piece = tuple[list[int], list[int]]


def pair_pieces(chosen: tuple[list, list], rejected: tuple[list, list], seq_len: int, out: Rows) -> list[tuple]:
    """A preference pair as [(chosen piece, rejected piece)]: each truncated to seq_len; none when either answer has
    nothing trainable left."""
    out.examples += 1
    sides = []
    cut = False
    for ids, mask in (chosen, rejected):
        cut = cut or len(ids) > seq_len
        ids, mask = ids[:seq_len], mask[:seq_len]
        sides.append((ids, _labels(ids, mask)))
    out.truncated += cut
    if any(all(x == IGNORE for x in labels) for _, labels in sides):
        out.dropped += 1
        return []
    return [tuple(sides)]


def lay_out_pairs(items: list[tuple[Piece, Piece]], seq_len: int, pad: int, pack: bool, out: Rows) -> Rows:
    """Pairs into row pairs [chosen row, rejected row]: when packing, the next pair joins the current row pair while
    both of its answers fit (the k-th example of either row is the same pair's), else one pair per row pair."""
    rows: list[list[list[int]]] = [[[], [], []], [[], [], []]]  # per side: ids, labels, positions

    def close() -> None:
        if rows[0][0]:
            out.ids.append([]), out.labels.append([]), out.positions.append([])
            for ids, labels, pos in rows:
                n = seq_len - len(ids)
                out.ids[-1].append(ids + [pad] * n)
                out.labels[-1].append(labels + [IGNORE] * n)
                out.positions[-1].append(pos + list(range(n)))

    for pair in items:
        if not pack or any(len(side[0]) + len(piece[0]) > seq_len for side, piece in zip(rows, pair)):
            close()
            rows = [[[], [], []], [[], [], []]]
        for side, (ids, labels) in zip(rows, pair):
            side[0], side[1], side[2] = side[0] + ids, side[1] + labels, side[2] + list(range(len(ids)))
            out.tokens += len(ids)
            out.trained_tokens += sum(x != IGNORE for x in labels)
    close()
    return out
