"""A preference job's own steps beside the loop: its evaluation (loss, rewards, reward margin and accuracy on the
validation pairs) and its reference log-probabilities precomputed in one pass (`precompute_reference`).

The precomputed values are the reference's at the job's start: the base with its adapters off (LoRA, QLoRA),
or the model itself before its first step (full fine-tuning). They are kept in output_dir/reference/ (the values,
then the key they were computed for, each written aside and renamed), so that a resumed job reads them back instead
of asking an already trained model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tunebench import watchdog
from tunebench.console import say
from tunebench.data.batches import _batch, capacity, eval_batches
from tunebench.data.prepare import Prepared
from tunebench.dist import DistContext
from tunebench.engine.model import eager_if_whole
from tunebench.engine.preference import PairStats, PreferenceLM
from tunebench.engine.step import autocast
from tunebench.errors import UserError
from tunebench.files import temp_beside

FIGURES = ("loss", "rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy")


def preference_module(module: torch.nn.Module) -> PreferenceLM:
    """The PreferenceLM inside whatever wraps it (DDP, FSDP2, DeepSpeed's engine)."""
    return next(m for m in module.modules() if isinstance(m, PreferenceLM))


def evaluate_pairs(module, prepared: Prepared, cfg, device: torch.device, ctx: DistContext,
                   reference: np.ndarray | None = None) -> dict[str, float]:
    """The validation pairs' mean loss (ORPO: with the NLL over every chosen answer token), mean rewards, mean
    margin and the share of pairs whose chosen answer out-rewards the rejected one (every rank its share)."""
    inner = preference_module(module)
    inner.collect = []
    module.eval()
    try:
        with torch.no_grad(), autocast(cfg, device, cache=False), eager_if_whole(module):
            for b in eval_batches(prepared, cfg.batch_size, device, ctx.rank, ctx.world_size, cfg.eval_batches,
                                  reference):
                module(*b)
                watchdog.beat()
        stats: list[PairStats] = inner.collect
    finally:
        inner.collect = None
        module.train()
    total = torch.zeros(7, device=device, dtype=torch.float64)
    for s in stats:
        v = s.valid.double()
        total += torch.stack([(s.losses.double() * v).sum(), v.sum(), (s.chosen_rewards.double() * v).sum(),
                              (s.rejected_rewards.double() * v).sum(),
                              ((s.chosen_rewards > s.rejected_rewards).double() * v).sum(), s.nll_sum.double(),
                              s.nll_tokens.double()])
    if ctx.active and ctx.world_size > 1:
        torch.distributed.all_reduce(total)
    pairs = float(total[1].clamp(min=1))
    loss = float(total[0]) / pairs + (float(total[5] / total[6].clamp(min=1)) if float(total[6]) else 0.0)
    chosen, rejected = float(total[2]) / pairs, float(total[3]) / pairs
    return {"loss": loss, "rewards_chosen": chosen, "rewards_rejected": rejected, "reward_margin": chosen - rejected,
            "reward_accuracy": float(total[4]) / pairs, "pairs": int(total[1])}


def precompute(module, prepared: Prepared, cfg, device: torch.device, ctx: DistContext, what: str) -> np.ndarray:
    """The reference's answer sums of every pair of `prepared`: (pairs, 2, per row). Every rank runs as many
    batches (a short share repeats its last pair: sharded models gather weights in every forward)."""
    ids, labels, positions = prepared.arrays()
    n, per_row = len(ids), inner_rows(module)
    out = torch.zeros((n, 2, per_row), device=device, dtype=torch.float32)
    share = list(range(ctx.rank, n, ctx.world_size))
    longest = -(-n // ctx.world_size)
    share += [share[-1]] * (longest - len(share)) if share else [0] * longest
    examples = 0 if positions is None else capacity(prepared, cfg.batch_size)
    inner = preference_module(module)
    inner.mode = "reference"
    shown = 0
    try:
        with torch.no_grad(), autocast(cfg, device, cache=False):
            for i in range(0, longest, cfg.batch_size):
                rows = np.asarray(share[i:i + cfg.batch_size])
                b = _batch(device, ids[rows], labels[rows], None if positions is None else positions[rows], examples)
                sums = module(*b).float()
                half = sums.shape[0] // 2
                out[torch.as_tensor(rows, device=device)] = torch.stack([sums[:half], sums[half:]], dim=1)
                watchdog.beat()
                if ctx.is_main and (i + cfg.batch_size) * 10 // longest > shown:
                    shown = (i + cfg.batch_size) * 10 // longest
                    say(f"reference: {what}: {min(n, (i + cfg.batch_size) * ctx.world_size):,} of {n:,} pairs")
    finally:
        inner.mode = "train"
    if ctx.active and ctx.world_size > 1:  # each pair's row written by one rank (a repeated one: the same values)
        owner = torch.zeros(n, device=device)
        owner[torch.as_tensor(sorted(set(share)), device=device)] = 1
        torch.distributed.all_reduce(out)
        torch.distributed.all_reduce(owner)
        out /= owner.clamp(min=1)[:, None, None]
    return out.cpu().numpy()


def inner_rows(module) -> int:
    return preference_module(module).per_row


def reference_values(module, prepared: Prepared | None, cfg, device: torch.device, ctx: DistContext, what: str,
                     resumed: bool) -> np.ndarray | None:
    """The reference's log-probabilities for `prepared`'s pairs: read from output_dir/reference/ when they were
    computed for these rows, else computed now (a resumed full fine-tune cannot: its model has trained)."""
    if prepared is None:
        return None
    folder = Path(cfg.output_dir) / "reference"
    key = {"rows": prepared.stats.get("fingerprint"), "path": Path(prepared.path).name, "seq_len": cfg.seq_len}
    kept = _read(folder, what, key)
    everywhere = torch.tensor([0.0 if kept is None else 1.0], device=device)
    if ctx.active and ctx.world_size > 1:  # every rank computes (its collectives) or none does
        torch.distributed.all_reduce(everywhere, op=torch.distributed.ReduceOp.MIN)
    if float(everywhere) > 0:
        return kept
    if resumed and cfg.method == "full":
        raise UserError(f"cannot resume: the reference log-probabilities precomputed at the job's start are missing "
                        f"from {folder} (a trained model is no longer the reference); start the job anew")
    values = precompute(module, prepared, cfg, device, ctx, what)
    if ctx.is_main:
        _write(folder, what, key, values)
    return values


def _read(folder: Path, what: str, key: dict[str, Any]) -> np.ndarray | None:
    try:
        if json.loads((folder / f"{what}.json").read_text()) != key:
            return None
        return np.load(folder / f"{what}.npy")
    except (OSError, ValueError):
        return None


def _write(folder: Path, what: str, key: dict[str, Any], values: np.ndarray) -> None:
    """The values, then their key (each written aside and renamed): the old key goes first, so a write cut between
    the two leaves values without a key, computed again, never new values under an old key."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{what}.json").unlink(missing_ok=True)
    target = folder / f"{what}.npy"
    tmp = temp_beside(target)
    with open(tmp, "wb") as f:
        np.save(f, values)
    os.replace(tmp, target)
    meta = folder / f"{what}.json"
    tmp = temp_beside(meta)
    tmp.write_text(json.dumps(key))
    os.replace(tmp, meta)
