"""Exports of a trained model to other runtimes' formats: GGUF for llama.cpp (`export_gguf`)."""

from tunebench.export.gguf import export_gguf

__all__ = ["export_gguf"]
