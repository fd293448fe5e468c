"""What an exception that ended a measurement means for its result: status and error text."""

from __future__ import annotations

import traceback


def failure(err: BaseException) -> tuple[str, str]:
    """The status and error of a result that an exception ended (call inside the except block)."""
    import torch

    if isinstance(err, torch.cuda.OutOfMemoryError):
        return "oom", str(err).splitlines()[0]
    if isinstance(err, MemoryError):
        return "oom", f"host out of memory: {err}"
    return "failed", traceback.format_exc(limit=-8)[-4000:]
