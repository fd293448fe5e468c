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


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / "state.json").read_text())


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
    if ctx.is_main:
        write_text(partial / "state.json", json.dumps(state, indent=1))
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
