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
    return ModelSpec(str(path), shape, path, any(path.glob("*.safetensors")), make_config=lambda: hf_config)
