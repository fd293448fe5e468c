"""Data ready to train: read, checked, tokenized, laid into rows and cached on disk, keyed by what decides the
result.

The key is the dataset's fingerprint (dataset.py: the source's bytes, shape and fields), the tokenizer's
(vocabulary, special tokens, chat template) and the settings (shape, fields, seq_len, packing,
train_on_prompt). A second run with the same key reads the cached arrays (memory-mapped) instead of
tokenizing again. The cache folder is written aside and renamed into place, so a killed tokenization never
leaves a cache that looks complete. The stats keep the damaged rows' counts by reason (validate.py).
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

from tunebench.console import say
from tunebench.data import examples
from tunebench.data.dataset import Checked, read
from tunebench.data.rows import Rows, lay_out, lay_out_pairs, pair_pieces, pieces
from tunebench.data.tokenizer import fingerprint, pad_id
from tunebench.data.validate import BadRow, Fields, Tally, enforce
from tunebench.errors import UserError

VERSION = 3  # of the cached layout: bump when rows are built differently (2: rows checked, chat masked by characters;
# 3: preference pairs, (pairs, 2, seq_len) arrays)


def cache_root() -> Path:
    env = os.environ.get("TUNEBENCH_CACHE")  # ~ and $VARS expanded, as a shell would have
    return (Path(os.path.expanduser(os.path.expandvars(env))) if env else Path.home() / ".cache" / "tunebench") / "data"


def writable_cache() -> Path:
    """The cache folder, made if needed; a TUNEBENCH_CACHE that cannot hold one is bad input named as such (a
    default folder that cannot is the machine's fault, named with its path)."""
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if env := os.environ.get("TUNEBENCH_CACHE"):
            raise UserError(f"invalid TUNEBENCH_CACHE={env}: cannot write there ({err.strerror}); give a folder "
                            "this user can write to") from None
        raise
    return root


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


def _encode_batch(tok, cfg, shape: str, what: str, data: str):
    encode = examples.ENCODERS[shape]

    def fn(batch: dict[str, list]) -> dict[str, list]:
        ids, masks, bad = [], [], []
        for i, where in enumerate(batch["_row"]):
            try:
                parts = encode(tok, {k: batch[k][i] for k in batch}, cfg.train_on_prompt)
                parts = parts if shape == "preference" else [parts]  # a pair's two answers, or one example
                reason = ""
            except BadRow as err:
                if cfg.strict_data:
                    raise UserError(f"invalid {what}={data}: {where}: {err.reason} (strict_data refuses damaged "
                                    "rows)") from None
                parts, reason = [], err.reason
            ids.append([a for a, _ in parts])
            masks.append([b for _, b in parts])
            bad.append(reason)
        return {"_ids": ids, "_mask": masks, "_bad": bad, "_row": batch["_row"]}

    return fn


def _rows(ds, tok, cfg, shape: str, pack: bool, what: str, data: str, tally: Tally) -> Rows:
    """The examples laid into rows; `tally` gains the rows the tokenizer found damaged (the chat template's)."""
    import sys

    import datasets

    cols = ds.column_names
    if sys.stderr.isatty():
        datasets.enable_progress_bars()
    else:  # a log: one line, not a redrawn bar
        print(f"tokenizing {len(ds):,} examples ({shape}) ...", file=sys.stderr, flush=True)
    try:
        encoded = ds.map(_encode_batch(tok, cfg, shape, what, data), batched=True, batch_size=256,
                         remove_columns=cols, desc=f"tokenizing ({shape})", load_from_cache_file=False)
    finally:
        datasets.disable_progress_bars()
    out = Rows()
    items = []
    for ids, mask, bad, where in zip(encoded["_ids"], encoded["_mask"], encoded["_bad"], encoded["_row"]):
        if bad:
            tally.add(bad, where)
        elif shape == "preference":
            items += pair_pieces((ids[0], mask[0]), (ids[1], mask[1]), cfg.seq_len, out)
        else:
            items += pieces(ids[0], mask[0], cfg.seq_len, shape == "text", out)
    return (lay_out_pairs if shape == "preference" else lay_out)(items, cfg.seq_len, pad_id(tok), pack, out)


def _check_tokenizer(tok, cfg, shape: str) -> None:
    """A chat template that parses; chat masked by characters needs a fast tokenizer's offsets (a slow, Python, one
    has none)."""
    templates = getattr(tok, "chat_template", None) if shape == "chat" else None
    for name, text in (templates.items() if isinstance(templates, dict) else [("", templates)] if templates else []):
        from jinja2 import TemplateSyntaxError
        from transformers.utils.chat_template_utils import _compile_jinja_template  # as apply_chat_template does

        try:
            _compile_jinja_template(text)
        except TemplateSyntaxError as err:
            raise UserError(f"invalid tokenizer: its chat template{f' {name!r}' if name else ''} does not parse (line "
                            f"{err.lineno}: {err.message}); fix chat_template in the tokenizer's folder "
                            "(tokenizer_config.json or chat_template.jinja)") from None
    if shape == "chat" and not cfg.train_on_prompt and getattr(tok, "chat_template", None) and \
            not getattr(tok, "is_fast", False):
        raise UserError("invalid tokenizer: a slow (Python) tokenizer gives no character offsets, which chat data "
                        "needs to find the assistant's tokens; give a fast one (a folder with tokenizer.json), or "
                        "--train-on-prompt to train on every token")


def _key(ds, tok, cfg, shape: str, pack: bool) -> str:
    parts = [VERSION, ds._fingerprint, fingerprint(tok), shape, cfg.seq_len, pack, cfg.train_on_prompt,
             *Fields.of(cfg)]
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
        positions = np.load(prepared.path / "positions.npy", mmap_mode="r")
        prepared.stats["fullest_row"] = fullest_row(positions.reshape(-1, positions.shape[-1]))
    return int(prepared.stats["fullest_row"])


def _digest(f: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    return {"bytes": f.stat().st_size, "sha256": h.hexdigest()}


def _cached(path: Path) -> dict | None:
    """The stats of a cached tokenization whose files are whole (sizes and checksums as written); a damaged one is
    removed, said in one line, and built again."""
    if not (path / "stats.json").is_file():
        return None
    try:
        stats = json.loads((path / "stats.json").read_text())
        files = stats["files"]
        whole = isinstance(files, dict) and bool(files) and all(
            (path / name).is_file() and _digest(path / name) == want for name, want in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        whole = False  # unreadable, or written before checksums were (rebuilt once)
    if whole:
        return stats
    say(f"data: the cached tokenization in {path} is damaged or from an older version: tokenizing again")
    shutil.rmtree(path, ignore_errors=True)
    return None


def _write(out: Rows, path: Path, stats: dict, pack: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        shape = (len(out.ids), *np.shape(out.ids[0])) if out.ids else (0,)  # (rows, seq_len) or (pairs, 2, seq_len)
        np.save(tmp / "ids.npy", np.asarray(out.ids, dtype=np.int32).reshape(shape))
        np.save(tmp / "labels.npy", np.asarray(out.labels, dtype=np.int32).reshape(shape))
        if pack:  # the fullest row sizes every batch's examples' bounds (data.batches): counted once, here
            positions = np.asarray(out.positions, dtype=np.int32).reshape(shape)
            np.save(tmp / "positions.npy", positions)
            stats["fullest_row"] = fullest_row(positions.reshape(-1, shape[-1]))
        stats["files"] = {f.name: _digest(f) for f in sorted(tmp.glob("*.npy"))}  # verified before each use
        (tmp / "stats.json").write_text(json.dumps(stats, indent=1))
        os.replace(tmp, path)
    except OSError:
        if not path.exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare(cfg, tok, data: str, what: str, checked: Checked, ds=None, file_counts: bool = True) -> Prepared:
    """The rows of `checked` (or of `ds`, a split of it), from the cache when they are there. The file's
    damaged-row counts go with these rows' stats when `file_counts` (not with a held-out split's)."""
    ds = checked.ds if ds is None else ds
    shape = checked.shape
    pack = cfg.packing if cfg.packing is not None else shape == "text"
    path = cache_root() / _key(ds, tok, cfg, shape, pack)
    stats = _cached(path)
    if stats is not None:
        enforce(Tally.of(stats), cfg, what, data)  # strict_data and max_bad_rows are not in the key
        return Prepared(path, stats)
    _check_tokenizer(tok, cfg, shape)
    tally = checked.tally.merged(Tally()) if file_counts else Tally(read=len(ds))  # a copy: the split's own
    out = _rows(ds, tok, cfg, shape, pack, what, data, tally)
    enforce(tally, cfg, what, data)
    if not out.ids:
        raise UserError(f"invalid {what}={data}: no example has anything to train on ({out.examples} read, "
                        f"{out.dropped} dropped)")
    stats = {"source": str(data), "fingerprint": ds._fingerprint, "shape": shape, "packing": pack,
             "seq_len": cfg.seq_len, "examples": out.examples, "truncated": out.truncated, "split": out.split,
             "dropped": out.dropped, "rows": len(out.ids), "tokens": out.tokens, "trained_tokens": out.trained_tokens,
             **tally.stats()}
    _write(out, path, stats, pack)
    return Prepared(path, stats)


def split_and_prepare(cfg, tok) -> tuple[Prepared, Prepared | None]:
    """The training rows and the validation rows (eval_data, or eval_fraction of data held out, seeded)."""
    sources = writable_cache() / "sources"
    data = read(cfg, cfg.data, "data", sources)
    if cfg.eval_data:
        held = read(cfg, cfg.eval_data, "eval_data", sources)
        return prepare(cfg, tok, cfg.data, "data", data), prepare(cfg, tok, cfg.eval_data, "eval_data", held)
    if cfg.eval_fraction:
        if len(data.ds) < 2:
            raise UserError(f"invalid eval_fraction={cfg.eval_fraction}: the data has only {len(data.ds)} usable "
                            "example")
        parts = data.ds.train_test_split(test_size=cfg.eval_fraction, seed=cfg.seed)
        return (prepare(cfg, tok, cfg.data, "data", data, parts["train"]),
                prepare(cfg, tok, f"{cfg.data} (held out {cfg.eval_fraction:g})", "data", data, parts["test"],
                        file_counts=False))
    return prepare(cfg, tok, cfg.data, "data", data), None
