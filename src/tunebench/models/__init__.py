"""Model zoo (presets and local directories) and the builder that puts a model on the device."""

from tunebench.models.build import build_model, load_meta_model
from tunebench.models.presets import PRESETS
from tunebench.models.spec import ModelSpec, resolve_model

__all__ = ["PRESETS", "ModelSpec", "build_model", "load_meta_model", "resolve_model"]
