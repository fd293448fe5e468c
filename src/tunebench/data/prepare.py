"""Data ready to train: read, tokenized, laid into rows and cached on disk, keyed by what decides the result.

The key is the dataset's fingerprint (from `datasets`), the tokenizer's (vocabulary, special tokens, chat
template) and the settings (shape, fields, seq_len, packing, train_on_prompt). A second run with the same
key reads the cached arrays (memory-mapped) instead of tokenizing again. The cache folder is written aside
and renamed into place, so a killed tokenization never leaves a cache that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tunebench.data import examples, files
from tunebench.data.rows import Rows, lay_out, pieces
from tunebench.data.tokenizer import fingerprint, pad_id
from tunebench.errors import UserError

VERSION = 1  # of the cached layout: bump when rows are built differently


def cache_root() -> Path:
    return Path(os.environ.get("TUNEBENCH_CACHE") or Path.home() / ".cache" / "tunebench") / "data"


@dataclass
class Prepared:
    path: Path  # the cache folder: ids.npy, labels.npy, positions.npy (packed only), stats.json
    stats: dict[str, Any]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        load = lambda n: np.load(self.path / f"{n}.npy", mmap_mode="r")  # noqa: E731
        return load("ids"), load("labels"), load("positions") if (self.path / "positions.npy").exists() else None

    @property
    def rows(self) -> int:
        return int(self.stats["rows"])


def _encode_batch(tok, cfg, shape: str):
    encode = {"text": examples.encode_text, "pairs": examples.encode_pair}.get(shape)

    def fn(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        rows = [{k: batch[k][i] for k in batch} for i in range(len(indices))]
        out = [encode(tok, r, cfg) if encode else examples.encode_chat(tok, r, cfg, idx)
               for r, idx in zip(rows, indices)]
        return {"_ids": [o[0] for o in out], "_mask": [o[1] for o in out]}

    return fn


def _rows(ds, tok, cfg, shape: str, pack: bool) -> Rows:
    import sys

    import datasets

    if shape == "chat":  # every message checked before the long part starts
        for i, row in enumerate(ds[cfg.messages_field]):
            examples.check_messages(row, i)
    cols = ds.column_names
    if sys.stderr.isatty():
        datasets.enable_progress_bars()
    else:  # a log: one line, not a redrawn bar
        print(f"tokenizing {len(ds):,} examples ({shape}) ...", file=sys.stderr, flush=True)
    try:
        encoded = ds.map(_encode_batch(tok, cfg, shape), batched=True, batch_size=256, with_indices=True,
                         remove_columns=cols, desc=f"tokenizing ({shape})", load_from_cache_file=False)
    finally:
        datasets.disable_progress_bars()
    out = Rows()
    items = []
    for ids, mask in zip(encoded["_ids"], encoded["_mask"]):
        items += pieces(ids, mask, cfg.seq_len, shape == "text", out)
    return lay_out(items, cfg.seq_len, pad_id(tok), pack, out)


def _key(ds, tok, cfg, shape: str, pack: bool) -> str:
    parts = [VERSION, ds._fingerprint, fingerprint(tok), shape, cfg.seq_len, pack, cfg.train_on_prompt,
             cfg.text_field, cfg.prompt_field, cfg.completion_field, cfg.messages_field]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def fullest_row(positions: np.ndarray, chunk: int = 4096) -> int:
    """Examples in the fullest packed row (an example starts where its position is 0, and every row starts one),
    read a chunk of rows at a time: the positions may be a memory-mapped file larger than memory."""
    most = 1
    for i in range(0, len(positions), chunk):
        rows = np.asarray(positions[i:i + chunk])
        most = max(most, int(((rows == 0).sum(axis=1) + (rows[:, 0] != 0)).max()))
    return most


def fullest_row_of(prepared: Prepared) -> int:
    """The prepared rows' fullest_row, from their stats; a cache written before the stats kept it is read once
    (then kept in these stats, in memory: every evaluation asks again)."""
    if "fullest_row" not in prepared.stats:
        prepared.stats["fullest_row"] = fullest_row(np.load(prepared.path / "positions.npy", mmap_mode="r"))
    return int(prepared.stats["fullest_row"])


def _write(out: Rows, path: Path, stats: dict, pack: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        np.save(tmp / "ids.npy", np.asarray(out.ids, dtype=np.int32).reshape(len(out.ids), -1))
        np.save(tmp / "labels.npy", np.asarray(out.labels, dtype=np.int32).reshape(len(out.labels), -1))
        if pack:  # the fullest row sizes every batch's examples' bounds (data.batches): counted once, here
            positions = np.asarray(out.positions, dtype=np.int32).reshape(len(out.ids), -1)
            np.save(tmp / "positions.npy", positions)
            stats["fullest_row"] = fullest_row(positions)
        (tmp / "stats.json").write_text(json.dumps(stats, indent=1))
        os.replace(tmp, path)
    except OSError:
        if not path.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare(cfg, tok, data: str, what: str = "data", ds=None) -> Prepared:
    """The rows of `data` (or of the given dataset `ds`, a split of it), from the cache when they are there."""
    ds = ds if ds is not None else files.load(data, what)
    shape = examples.detect(ds.column_names, cfg)
    pack = cfg.packing if cfg.packing is not None else shape == "text"
    path = cache_root() / _key(ds, tok, cfg, shape, pack)
    if (path / "stats.json").is_file():
        return Prepared(path, json.loads((path / "stats.json").read_text()))
    out = _rows(ds, tok, cfg, shape, pack)
    if not out.ids:
        raise UserError(f"invalid {what}={data}: no example has anything to train on ({out.examples} read, "
                        f"{out.dropped} dropped)")
    stats = {"source": str(data), "fingerprint": ds._fingerprint, "shape": shape, "packing": pack,
             "seq_len": cfg.seq_len, "examples": out.examples, "truncated": out.truncated, "split": out.split,
             "dropped": out.dropped, "rows": len(out.ids), "tokens": out.tokens, "trained_tokens": out.trained_tokens}
    _write(out, path, stats, pack)
    return Prepared(path, stats)


def split_and_prepare(cfg, tok) -> tuple[Prepared, Prepared | None]:
    """The training rows and the validation rows (eval_data, or eval_fraction of data held out, seeded)."""
    ds = files.load(cfg.data, "data")
    if cfg.eval_data:
        return prepare(cfg, tok, cfg.data, "data", ds), prepare(cfg, tok, cfg.eval_data, "eval_data")
    if cfg.eval_fraction:
        if len(ds) < 2:
            raise UserError(f"invalid eval_fraction={cfg.eval_fraction}: the data has only {len(ds)} example")
        parts = ds.train_test_split(test_size=cfg.eval_fraction, seed=cfg.seed)
        return (prepare(cfg, tok, cfg.data, "data", parts["train"]),
                prepare(cfg, tok, f"{cfg.data} (held out {cfg.eval_fraction:g})", "data", parts["test"]))
    return prepare(cfg, tok, cfg.data, "data", ds), None
