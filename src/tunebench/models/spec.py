"""Resolve a model name to its shape without building anything (and, for presets, without torch).

A ModelSpec answers shape questions (layers, heads, vocabulary, positions) from plain config data,
so checks and deployments need neither torch nor transformers; `hf_config` builds the transformers
config only when a model is actually built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunebench.errors import UserError
from tunebench.models.presets import PRESETS


@dataclass(frozen=True)
class ModelSpec:
    name: str
    shape: dict[str, Any]  # config.json keys (a preset's, or the local directory's)
    path: Path | None = None  # local directory, None for presets
    has_weights: bool = False  # safetensors present in the local directory
    make_config: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def _get(self, *keys: str) -> Any:
        return next((self.shape[k] for k in keys if self.shape.get(k) is not None), None)

    @property
    def hf_config(self) -> Any:
        """The transformers config (built on first use: this imports transformers and torch)."""
        cached = self.__dict__.get("_hf_config")
        if cached is None:
            cached = self.make_config()
            object.__setattr__(self, "_hf_config", cached)
        return cached

    @property
    def max_positions(self) -> int | None:
        return self._get("max_position_embeddings", "n_positions")

    @property
    def num_layers(self) -> int:
        return self._get("num_hidden_layers", "n_layer")

    @property
    def num_heads(self) -> int:
        return self._get("num_attention_heads", "n_head")

    @property
    def hidden_size(self) -> int:
        return self._get("hidden_size", "n_embd")

    @property
    def head_dim(self) -> int:
        return self._get("head_dim") or self.hidden_size // self.num_heads

    @property
    def vocab_size(self) -> int:
        return self.shape["vocab_size"]


def _looks_like_path(name: str) -> bool:
    return os.sep in name or name.startswith((".", "~")) or os.path.exists(name)


def resolve_model(name: str) -> ModelSpec:
    """A preset name or a local directory holding config.json; anything else is refused."""
    if name in PRESETS:
        preset = PRESETS[name]
        return ModelSpec(name, {"model_type": preset.family} | preset.shape, make_config=preset.hf_config)
    if not _looks_like_path(name):
        raise UserError(f"invalid model={name}: not a preset ({', '.join(PRESETS)}) nor a local directory")
    path = Path(name).expanduser()
    if not path.exists():
        raise UserError(f"invalid model={name}: local model path does not exist")
    if not (path / "config.json").is_file():
        raise UserError(f"invalid model={name}: directory has no config.json (not a Hugging Face model)")
    try:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as err:  # transformers raises several types for unreadable configs
        raise UserError(f"invalid model={name}: config.json could not be read ({str(err).splitlines()[0]})") from None
    shape = json.loads((path / "config.json").read_text()) | hf_config.to_dict()
    weights = sorted(path.glob("*.safetensors"))
    for file in weights:
        if (why := _damaged(file)) is not None:
            raise UserError(f"invalid model={name}: {file.name} is damaged ({why}); copy the model folder again")
    spec = ModelSpec(str(path), shape, path, bool(weights), make_config=lambda: hf_config)
    if (why := _implausible(spec, weights)) is not None:
        raise UserError(f"invalid model={name}: {why}")
    return spec


def _implausible(spec: ModelSpec, weights: list[Path]) -> str | None:
    """A config.json no model can have (a size below one), or one its weights contradict (an embedding table of
    another vocabulary): said before anything is built."""
    for size in ("hidden_size", "num_layers", "num_heads", "vocab_size"):
        v = getattr(spec, size)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            return f"config.json gives {size.replace('num_layers', 'num_hidden_layers')} = {v!r}: it must be a " \
                   "whole number of at least 1"
    for file in weights:
        rows = _embedding_rows(file)
        if rows is not None and spec.vocab_size is not None and rows != spec.vocab_size:
            return (f"config.json says vocab_size {spec.vocab_size:,}, but the embeddings in {file.name} have "
                    f"{rows:,} rows")
    return None


EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")


def _embedding_rows(file: Path) -> int | None:
    """The rows of the input embedding table in one safetensors file (None where it holds none)."""
    with open(file, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    for key, v in header.items():
        if key.endswith(EMBEDDINGS) and isinstance(v, dict) and isinstance(v.get("shape"), list) and v["shape"]:
            return int(v["shape"][0])
    return None


def _damaged(file: Path) -> str | None:
    """Why a safetensors file cannot be whole, from its header alone: its size must be the header's and the
    last tensor's end exactly (a copy cut short, or bytes that are not safetensors, fail this)."""
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > size - 8:
                return f"{size:,} bytes, no safetensors header"
            header = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError) as err:
        return f"its header cannot be read: {type(err).__name__}"
    if not isinstance(header, dict):
        return "its header is not a table of tensors"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
    expected = 8 + n + max(ends, default=0)
    if size != expected:
        return f"{size:,} bytes where its header says {expected:,}"
    return None
