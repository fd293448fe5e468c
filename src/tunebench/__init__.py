"""tunebench: benchmark and run LLM fine-tuning (full, LoRA, QLoRA) with correct numbers.

The Python API is as usable as the CLI::

    from tunebench import RunConfig, run, Store
    rec = run(RunConfig(model="tiny-llama", method="lora", steps=6, warmup=2))
    Store().save(rec)
"""

__version__ = "0.1.0"

from tunebench.config import RunConfig, load_config  # noqa: E402
from tunebench.errors import UserError  # noqa: E402
from tunebench.record import ResultRecord  # noqa: E402
from tunebench.runner import preflight, run  # noqa: E402
from tunebench.store import Store  # noqa: E402

__all__ = ["RunConfig", "ResultRecord", "Store", "UserError", "__version__", "load_config", "preflight", "run"]
