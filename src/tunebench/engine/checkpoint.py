"""Checkpoints of a training job: a folder per step, complete or absent, the last K kept.

    output_dir/checkpoints/step-000120/   state.json (written last), rng-rank-R.pt, and what the strategy
                                          writes: model/ + optimizer.pt (single, DDP), dcp/ (FSDP2),
                                          deepspeed/ (ZeRO); scheduler.pt
A checkpoint is written into a `.step-000120.partial` folder and renamed into place once every rank has
written its part and rank 0 has written state.json: a killed save leaves only a partial folder, which
`latest` never picks (and the next save removes). state.json holds the step, the data position, the loss
history, the world size and the configuration's identity, so a resume can refuse what would not continue
exactly.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tunebench.dist import DistContext
from tunebench.errors import UserError
from tunebench.files import write_text

STEP_DIR = re.compile(r"step-(\d+)")


def folder(root: Path) -> Path:
    return root / "checkpoints"


def complete(root: Path) -> list[Path]:
    """Complete checkpoints under output_dir `root`, oldest first."""
    f = folder(root)
    found = [p for p in f.iterdir() if STEP_DIR.fullmatch(p.name) and (p / "state.json").is_file()] if f.is_dir() \
        else []
    return sorted(found, key=lambda p: int(STEP_DIR.fullmatch(p.name).group(1)))


def find(root: Path, resume: str) -> Path | None:
    """The checkpoint `resume` names: latest, auto (latest or none), or a folder."""
    if resume in ("latest", "auto"):
        found = complete(root)
        if not found and resume == "latest":
            raise UserError(f"invalid resume=latest: {folder(root)} holds no complete checkpoint")
        return found[-1] if found else None
    path = Path(resume).expanduser()
    if not (path / "state.json").is_file():
        raise UserError(f"invalid resume={resume}: not a complete tunebench checkpoint (no state.json)")
    return path


# what state.json must hold, and of what type, for a resume to continue from it
STATE_KEYS = {"step": int, "total": int, "epoch": int, "micro": int, "losses": list, "eval_curve": list,
              "world_size": int, "identity": dict}


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's state.json, verified: whole, of the right types, its files the sizes they were written at
    (state.json is written last, with them). Refused in words naming the checkpoint, never trusted blind."""
    def damaged(why: str) -> UserError:
        return UserError(f"checkpoint {path} is damaged ({why}); resume from an earlier one (--resume "
                         f"{path.parent}/step-...) or start anew (--overwrite)")

    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise damaged(f"state.json unreadable: {type(err).__name__}") from None
    if not isinstance(state, dict):
        raise damaged("state.json is not an object")
    for key, kind in STATE_KEYS.items():
        value = state.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
            raise damaged(f"state.json's {key} is {type(value).__name__ if key in state else 'missing'}, "
                          f"not {'a non-negative ' if kind is int else 'a '}{kind.__name__}")
    for name, size in (state.get("files") or {}).items():  # checkpoints written before sizes were: not checked
        f = path / name
        if not f.is_file() or f.stat().st_size != size:
            raise damaged(f"{name} is {f.stat().st_size if f.is_file() else 'missing'} bytes, written as {size}")
    return state


def sizes(folder_: Path) -> dict[str, int]:
    """Every file's size under a checkpoint folder, by relative path (state.json records them)."""
    return {str(f.relative_to(folder_)): f.stat().st_size for f in sorted(folder_.rglob("*")) if f.is_file()}


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(root: Path, step: int, state: dict[str, Any], write_parts, ctx: DistContext, keep: int) -> Path:
    """Write checkpoint `step` on every rank: `write_parts(folder)` writes the strategy's files; rank 0 then
    writes state.json, renames the folder into place and removes all but the last `keep`."""
    final = folder(root) / f"step-{step:06d}"
    partial = folder(root) / f".step-{step:06d}.partial"
    if ctx.is_main:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    ctx.barrier()
    torch.save(rng_state(), partial / f"rng-rank-{ctx.rank}.pt")
    write_parts(partial)
    ctx.barrier()  # every rank's part is on disk
    if ctx.is_main:  # state.json last, with the size of every part: a resume verifies them
        write_text(partial / "state.json", json.dumps(state | {"files": sizes(partial)}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        for old in complete(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    ctx.barrier()
    return final


def load_rng(path: Path, ctx: DistContext) -> None:
    f = path / f"rng-rank-{ctx.rank}.pt"
    if f.is_file():
        set_rng_state(torch.load(f, weights_only=False))
