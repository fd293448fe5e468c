"""tunebench: benchmark and run LLM fine-tuning (full, LoRA, QLoRA) with correct numbers.

The Python API is as usable as the CLI::

    from tunebench import RunConfig, run
    rec = run(RunConfig(model="tiny-llama", method="lora", steps=6, warmup=2), store="results.db")

Names are imported on first use, so `import tunebench` (and `tunebench --help`) loads no torch.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

# torchao's wheels carry compiled kernels for one CUDA and torch build; elsewhere (a CPU machine, another CUDA)
# each fails to load with a warning as soon as transformers imports torchao, though float8 training needs none of
# them; and its registration of enums with torch's pytree warns of a deprecation on newer torch. bitsandbytes warns on
# import, on every CPU run, that an optional faster CPU kernel (the `kernels` package) is absent: it falls back to its
# own. Errors still show.
for _name in ("torchao", "torch.utils._pytree", "bitsandbytes.backends.cpu.ops"):
    logging.getLogger(_name).setLevel(logging.ERROR)

_EXPORTS = {
    "RunConfig": "tunebench.config", "load_config": "tunebench.config", "UserError": "tunebench.errors",
    "ResultRecord": "tunebench.record", "Store": "tunebench.store", "preflight": "tunebench.runner",
    "run": "tunebench.api", "run_scaling": "tunebench.api",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
