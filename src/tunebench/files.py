"""Every file tunebench writes goes through here: written beside its target, then renamed into place.

A reader (or a crash) therefore sees the old file or the new one, never a half-written one. The
temporary name starts with a dot and ends with ``.tmp-<pid>`` so a left-over one is recognisable.
A folder of outputs (a report, a tune's) is claimed before any work and carries a manifest of what was
written into it, so a user's own files are never overwritten.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from tunebench.errors import UserError


def temp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def written_aside(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on failure it is removed. A link is
    never replaced: what it points to is written (aside and renamed there). A device or a pipe (`/dev/stdout`,
    `/dev/null`, a FIFO) is never replaced by a file: it is written into as it is."""
    path = Path(path)
    with _naming(path):
        if path.exists() and not path.is_file() and not path.is_dir():  # followed through a link too
            yield path
            return
        if path.is_symlink():
            path = path.resolve()
        tmp = temp_beside(path)
        try:
            yield tmp
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An OSError while writing `path` (a full disk, a forbidden folder) names it, as an open() would."""
    try:
        yield
    except OSError as err:
        if not err.filename:
            err.filename = str(path)
        raise


def write_text(path: str | Path, text: str) -> Path:
    with written_aside(path) as tmp:
        tmp.write_text(text)
    return Path(path)



def claim_folder(out: Path, manifest: str, what: str, force: bool = False) -> None:
    """Refuse a folder that is not ours to write `what` into: a file, the root, or a folder holding someone
    else's files (one without our `manifest`, unless forced); then create it. Called before any work."""
    if out.exists() and not out.is_dir():
        raise UserError(f"invalid out={out}: is a file; give a folder for the {what}")
    if out.resolve() == Path(out.resolve().anchor):
        raise UserError(f"invalid out={out}: the root folder; give a folder of its own for the {what}")
    if out.is_dir() and any(out.iterdir()) and not (out / manifest).is_file() and not force:
        raise UserError(f"invalid out={out}: the folder holds files that are not a tunebench {what}; give a new or "
                        "empty folder, or --force to write into it anyway")
    if out.is_dir():
        for entry in out.iterdir():
            if (why := _not_replaceable(entry)) is not None:
                raise UserError(f"invalid out={out}: {entry} is {why}, where the {what} writes its files; remove it "
                                "or give another folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"invalid out={out}: cannot be created ({err.strerror or err})") from None


OUTPUT_SUFFIXES = (".md", ".html", ".csv", ".parquet", ".png", ".json", ".yaml")


def _not_replaceable(entry: Path) -> str | None:
    """Why a writer must not write over `entry` in its folder: a link would carry the write to its target, a
    FIFO would block it, a device or a folder under an output's name would fail it. None for a regular file."""
    if entry.is_symlink():
        return "a link"
    if entry.is_dir():
        return "a folder" if entry.suffix in OUTPUT_SUFFIXES else None
    if not entry.is_file():
        return "not a regular file"
    return None


def replace_manifest(out: Path, manifest: str, written: list[Path]) -> None:
    """Record what was written into `out`; remove what the previous writer listed and this one did not."""
    names = sorted({p.relative_to(out).as_posix() for p in written})
    old = out / manifest
    if old.is_file():
        try:
            previous = json.loads(old.read_text()).get("files", [])
        except (ValueError, AttributeError):
            previous = []
        for stale in set(previous) - set(names):
            if "/" not in stale.replace("publish/", "", 1) and not stale.startswith(".."):
                (out / stale).unlink(missing_ok=True)
    write_text(old, json.dumps({"files": names}, indent=1))
