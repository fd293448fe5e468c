"""Resolve a model name to its Hugging Face config without building anything."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

from tunebench.errors import UserError
from tunebench.models.presets import PRESETS


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hf_config: PretrainedConfig
    path: Path | None = None  # local directory, None for presets
    has_weights: bool = False  # safetensors present in the local directory

    @property
    def max_positions(self) -> int | None:
        c = self.hf_config
        return getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)

    @property
    def num_layers(self) -> int:
        return self.hf_config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.hf_config.num_attention_heads

    @property
    def head_dim(self) -> int:
        c = self.hf_config
        return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size


def _looks_like_path(name: str) -> bool:
    return os.sep in name or name.startswith((".", "~")) or os.path.exists(name)


def resolve_model(name: str) -> ModelSpec:
    """A preset name or a local directory holding config.json; anything else is refused."""
    if name in PRESETS:
        return ModelSpec(name, PRESETS[name]())
    if not _looks_like_path(name):
        raise UserError(f"invalid model={name}: not a preset ({', '.join(PRESETS)}) nor a local directory")
    path = Path(name).expanduser()
    if not path.exists():
        raise UserError(f"invalid model={name}: local model path does not exist")
    if not (path / "config.json").is_file():
        raise UserError(f"invalid model={name}: directory has no config.json (not a Hugging Face model)")
    try:
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as err:  # transformers raises several types for unreadable configs
        raise UserError(f"invalid model={name}: config.json could not be read ({str(err).splitlines()[0]})") from None
    has_weights = any(path.glob("*.safetensors"))
    return ModelSpec(str(path), hf_config, path, has_weights)
