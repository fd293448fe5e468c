"""Model zoo (presets and local directories) and the builder that puts a model on the device.

The shapes (`presets`, `spec`) import no torch; the builder is imported on first use.
"""

from __future__ import annotations

from typing import Any

from tunebench.models.presets import PRESETS
from tunebench.models.spec import ModelSpec, resolve_model

__all__ = ["PRESETS", "ModelSpec", "build_model", "load_meta_model", "resolve_model"]


def __getattr__(name: str) -> Any:
    if name in ("build_model", "load_meta_model"):
        from tunebench.models import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
