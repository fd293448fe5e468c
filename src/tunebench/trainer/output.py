"""The output folder of a training job: whose it is, and whether this job may write into it.

    output_dir/run.json       the job's identity (configuration hash, data and tokenizer fingerprints,
                              world size): written when the job starts
    output_dir/.tokenizer/    the tokenizer as the job loaded it, written when the job starts: what the job
                              saves beside its model at the end, whatever became of the user's folder meanwhile
    checkpoints/  adapter/ or model/  merged/  record.json  tensorboard/  mlruns/  reference/ (dpo's precomputed)

A folder that holds another job is refused unless the job resumes it (--resume) or starts anew
(--overwrite, which removes the previous job's own files and nothing else). A checkpoint of another
configuration, data, tokenizer or world size is refused: it would not continue exactly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunebench.config import TrainConfig
from tunebench.engine import checkpoint
from tunebench.errors import UserError
from tunebench.files import write_text

LOCK = ".tunebench.lock"  # held (flock) by the job's launching process: released by the kernel when it dies
OWN = ("checkpoints", "adapter", "model", "merged", "run.json", "record.json", "tensorboard", "mlruns", ".tokenizer",
       "reference")


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """This job's exclusive hold on `out` for its whole run: a second job into the same folder is refused naming
    the holder. The lock is the kernel's (flock), so a job that died left nothing to take over by hand."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise UserError(f"invalid output_dir={out}: cannot write there ({err.strerror}); give a folder this user "
                        "can write to") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            raise UserError(f"invalid output_dir={out}: a training job is running there ({holder}); wait for it "
                            "to end, or give another output_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock
        if created and [p.name for p in out.iterdir()] == [LOCK]:  # refused before writing: leave nothing behind
            (out / LOCK).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                out.rmdir()


def claim(out: Path, resume: str | None, overwrite: bool) -> Path | None:
    """Check the folder before anything is computed; the checkpoint to resume from (or None)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"invalid output_dir={out}: is a file")
    ours = (out / "run.json").is_file()
    foreign = out.is_dir() and any(p.name not in OWN and not p.name.startswith(".") for p in out.iterdir())
    if foreign and not overwrite:
        raise UserError(f"invalid output_dir={out}: holds files that are not a tunebench training job; give a new "
                        "folder (or --overwrite to write beside them)")
    if overwrite:
        for name in OWN:
            shutil.rmtree(out / name, ignore_errors=True) if (out / name).is_dir() else (out / name).unlink(
                missing_ok=True)
        return None
    if resume:
        return checkpoint.find(out, resume)
    if ours:
        n = len(checkpoint.complete(out))
        raise UserError(f"invalid output_dir={out}: holds another training job ({n} checkpoint(s)); give --resume "
                        "latest to continue it, or --overwrite to start anew")
    return None


def check_progress(ck: Path, total: int) -> None:
    """A checkpoint continues this job only if steps are left to train: a finished job is not run again (its model
    and record are in the folder), a step past the job's total is not this job's."""
    step = checkpoint.read_state(ck)["step"]
    if step == total:
        raise UserError(f"invalid resume={ck}: the job finished there ({step}/{total} steps; its outputs are in "
                        f"{ck.parent.parent}); nothing is left to train (start anew with --overwrite)")
    if step > total:
        raise UserError(f"invalid resume={ck}: the checkpoint is at step {step}, past this job's {total} steps: "
                        "it is not this job's (same data, batch and max_steps/epochs continue it)")


def check_resume(ck: Path, identity: dict[str, Any], fields: dict[str, Any] | None = None) -> None:
    """The checkpoint must be of this job: same configuration, data, tokenizer and world size. `fields`: this
    job's configuration fields that make its hash, to name those that changed (a default that changed included)."""
    theirs = checkpoint.read_state(ck).get("identity", {})
    differs = [k for k in identity if theirs.get(k) != identity[k]]
    if differs:
        what = ", ".join(f"{k} ({theirs.get(k)} there, {identity[k]} here)" for k in differs)
        changed = _changed_fields(ck.parent.parent / "run.json", fields) if "config" in differs and fields else ""
        what += f"; fields changed: {changed}" if changed else ""
        raise UserError(f"invalid resume={ck}: the checkpoint is of another job: {what}; resume with the same "
                        "configuration (a different world size cannot continue the same data order)")


def _changed_fields(run_json: Path, fields: dict[str, Any]) -> str:
    """The hashed fields of the job that wrote `run_json` that differ from `fields` ("" where unknown)."""
    try:
        before = TrainConfig.model_validate(json.loads(run_json.read_text())["config"]).identity_config().model_dump()
    except (OSError, ValueError, KeyError):
        return ""
    return ", ".join(f"{k} {before.get(k)!r} there, {v!r} here" for k, v in fields.items()
                     if k in before and before[k] != v)


def keep_tokenizer(out: Path, tokenizer) -> Path:
    """The job's own copy of its tokenizer (written aside, renamed into place): nothing the job reads at its end
    depends on the user's folder still being there."""
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    dest = out / ".tokenizer"
    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer.partial-", dir=out))
    try:
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def write_identity(out: Path, identity: dict[str, Any], cfg) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "run.json", json.dumps({"identity": identity, "config": cfg.model_dump()}, indent=1))
