"""What every tunebench process installs first: transformers' generation module loads without scikit-learn.

That module imports scikit-learn's metrics whenever scikit-learn is installed, for one option of assisted decoding
(`assistant_confidence_threshold`) that nothing here uses; lm-evaluation-harness (`tunebench eval`) depends on
scikit-learn, so it is installed wherever evaluation is, and every process that builds a model (each rank, trial
and sweep attempt) paid about a second of start-up for it. The hook hides the package from that module while it
executes (the module asks whether it is installed as it loads); for everything else, evaluation's metrics
included, it stays importable. Installing the hook imports nothing (`plan` never imports torch).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

# module -> the package hidden while it executes
GUARDED = {"transformers.generation.candidate_generator": "sklearn"}


class _Hiding(importlib.abc.Loader):
    """The module's own loader, run with `hidden` absent from sys.modules' point of view."""

    def __init__(self, inner: importlib.abc.Loader, hidden: str):
        self.inner, self.hidden = inner, hidden

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if self.hidden in sys.modules:  # imported already: nothing to save
            self.inner.exec_module(module)
            return
        sys.modules[self.hidden] = None  # type: ignore[assignment]  # find_spec answers None: "not installed"
        try:
            self.inner.exec_module(module)
        finally:
            if sys.modules.get(self.hidden, False) is None:
                del sys.modules[self.hidden]


class _Guard(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001 - the finder protocol's signature
        if name not in GUARDED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Hiding(spec.loader, GUARDED[name])
                return spec
        return None


def install() -> None:
    """Once per process, before transformers' models are imported (later: no effect, no harm)."""
    if not any(isinstance(f, _Guard) for f in sys.meta_path):
        sys.meta_path.insert(0, _Guard())
