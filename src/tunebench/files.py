"""Every file tunebench writes goes through here: written beside its target, then renamed into place.

A reader (or a crash) therefore sees the old file or the new one, never a half-written one. The
temporary name starts with a dot and ends with ``.tmp-<pid>`` so a left-over one is recognisable.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def temp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def written_aside(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    with written_aside(path) as tmp:
        tmp.write_text(text)
    return Path(path)

