"""What every tunebench process installs first: transformers' modules load without packages only they would import.

transformers' generation module imports scikit-learn's metrics whenever scikit-learn is installed, for one option of
assisted decoding (`assistant_confidence_threshold`) that nothing here uses; lm-evaluation-harness (`tunebench eval`)
depends on scikit-learn, so it is installed wherever evaluation is, and every process that builds a model (each rank,
trial and sweep attempt) paid about a second of start-up for it. Its loss registry likewise imports SciPy for object
detection's matching, and its quantizer registry torchao (float8 training's, imported by tunebench itself where a
run asks for it) for loading torchao-quantized checkpoints: well over a second more between them on a slow CPU.
The hook hides the package from that module while it executes: the module asks transformers whether it is
installed as it loads, and transformers' remembered answer (`import transformers` asks for SciPy already) is
forgotten before and after, so that module alone sees it absent. For everything else, evaluation's metrics and
float8 included, it stays importable, and transformers answers truly. Should a module import the package without
asking, it loads as it is. Installing the hook imports nothing (`plan` never imports torch).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

# module -> the package hidden while it executes
GUARDED = {"transformers.generation.candidate_generator": "sklearn",
           "transformers.loss.loss_utils": "scipy",  # its registry imports every loss, object detection's too
           "transformers.quantizers.quantizer_torchao": "torchao"}


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
        _forget(self.hidden)
        sys.modules[self.hidden] = None  # type: ignore[assignment]  # find_spec answers None: "not installed"
        try:
            self.inner.exec_module(module)
        except ImportError:  # it imports the package without asking: load the module as it is
            del sys.modules[self.hidden]
            self.inner.exec_module(module)
        finally:
            if sys.modules.get(self.hidden, False) is None:
                del sys.modules[self.hidden]
            _forget(self.hidden)


def _forget(package: str) -> None:
    """Clear transformers' cached answer to "is `package` installed?" (its is_<package>_available)."""
    checks = sys.modules.get("transformers.utils.import_utils")
    clear = getattr(getattr(checks, f"is_{package}_available", None), "cache_clear", None)
    if clear is not None:
        clear()


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
