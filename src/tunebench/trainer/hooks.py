"""Between two steps of a training job: log lines, evaluation, checkpoints, and the stop a signal asks for.

SIGTERM or SIGINT sets a flag; the next step carries it to every rank (averaged with the loss), and the
loop ends at that step boundary with a checkpoint, so a preempted job loses at most the step in flight.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tunebench import watchdog
from tunebench.console import say
from tunebench.data.batches import DatasetBatches, eval_batches
from tunebench.dist import DistContext
from tunebench.engine import checkpoint
from tunebench.engine.loop import LoopResult
from tunebench.engine.model import eager_if_whole
from tunebench.engine.schedule import lr_of_step
from tunebench.engine.step import autocast
from tunebench.format import duration
from tunebench.metrics.memory import peak_allocated
from tunebench.units import GIB


class StopRequest:
    """The flag a signal sets, and the tensor that carries it to every rank with the next step."""

    def __init__(self, device: torch.device):
        self.asked = False
        self.flag = torch.zeros((), device=device)
        self._old = {s: signal.signal(s, self._ask) for s in (signal.SIGTERM, signal.SIGINT)}

    def _ask(self, signum, frame) -> None:  # only a Python flag here: the tensor is set between steps
        self.asked = True

    def before_step(self) -> None:
        if self.asked:
            self.flag.fill_(1.0)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def evaluate(module, prepared, cfg, device: torch.device, ctx: DistContext) -> float:
    """Mean loss over the validation tokens (every rank its share, summed over ranks)."""
    module.eval()
    total = torch.zeros(2, device=device, dtype=torch.float64)
    with torch.no_grad(), autocast(cfg, device, cache=False), eager_if_whole(module):
        for b in eval_batches(prepared, cfg.batch_size, device, ctx.rank, ctx.world_size, cfg.eval_batches):
            n = (b.labels != -100).sum()
            total += torch.stack([module(*b).double() * n, n.double()])
            watchdog.beat()  # a long evaluation is progress, not a hang
    module.train()
    if ctx.active and ctx.world_size > 1:
        torch.distributed.all_reduce(total)
    return float(total[0] / total[1].clamp(min=1))


def loss_text(loss: float | None, loss_step: int, done: int) -> str:
    """A GPU's losses are read back a few steps late (the loop keeps the device fed): a loss from an earlier step
    says which one, and none read yet since the process started (just after a resume) says so."""
    if loss is None:
        return "loss pending"
    return f"loss {loss:.4f}" if loss_step == done else f"loss {loss:.4f} (step {loss_step})"


@dataclass
class JobState:
    """What a checkpoint keeps beside the weights, and what the record reports."""

    history: list[float] = field(default_factory=list)  # losses of the steps before this process started
    eval_curve: list[list[float]] = field(default_factory=list)  # [step, eval loss]
    checkpoints: list[str] = field(default_factory=list)
    target_s: float | None = None  # seconds (of training) until eval loss first reached the target
    elapsed_before: float = 0.0  # training seconds in earlier processes of this job
    preference: list[list[Any]] = field(default_factory=list)  # [step, {rewards, margin, accuracy}] (pairs)


@dataclass
class TrainHooks:
    cfg: Any
    ctx: DistContext
    out: Path
    total: int
    data: DatasetBatches
    ts: Any  # engine.step.TrainStep
    sched: Any
    eval_data: Any  # data.prepare.Prepared or None
    identity: dict[str, Any]
    tokens_per_step: int  # all ranks
    flops_per_token: float | None
    peak: float | None
    trackers: Any = None
    state: JobState = field(default_factory=JobState)
    started: float = field(default_factory=time.perf_counter)
    held_reference: Any = None  # the validation pairs' precomputed reference log-probabilities

    def due(self, done: int) -> bool:
        c = self.cfg
        return bool((c.eval_every and done % c.eval_every == 0) or (c.save_every and done % c.save_every == 0))

    def log(self, done: int, result: LoopResult, timed_s: float, timed_steps: int, loss_step: int) -> None:
        if not self.ctx.is_main or (done % self.cfg.log_every and done != self.total):
            return
        tps = timed_steps * self.tokens_per_step / timed_s if timed_s > 0 and timed_steps else None
        mfu = self.flops_per_token * tps / self.ctx.world_size / self.peak if tps and self.peak and \
            self.flops_per_token else None
        eta = (self.total - done) * timed_s / timed_steps if timed_steps else None
        loss = result.losses[-1] if result.losses and loss_step else None
        mem = peak_allocated(torch.device("cuda"), self.cfg.cuda_graphs is True) / GIB \
            if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        lr = lr_of_step(self.sched, done)  # the rate step `done` ran at (the scheduler already holds the next)
        parts = [f"step {done}/{self.total}", loss_text(loss, loss_step, done),
                 f"lr {lr:.3g}", "" if tps is None else f"{tps:,.0f} tokens/s",
                 "" if mfu is None else f"MFU {mfu:.1%}", "" if mem is None else f"peak {mem:.2f} GiB",
                 "" if eta is None else f"ETA {duration(eta)}"]
        say("train: " + ", ".join(p for p in parts if p))
        if self.trackers:
            if loss is not None:  # at the step it belongs to, so the curve is not shifted by the read-back lag
                self.trackers.log({"train/loss": loss}, loss_step)
            self.trackers.log({"train/lr": lr, "train/tokens_per_s": tps, "train/mfu": mfu}, done)

    def run(self, done: int, result: LoopResult, stop: bool) -> bool:
        c, last = self.cfg, done == self.total
        if self.eval_data is not None and ((c.eval_every and done % c.eval_every == 0) or last):
            self.evaluate(done)
        if stop or last or (c.save_every and done % c.save_every == 0):
            self.save(done, result)
        return stop

    def evaluate(self, done: int) -> None:
        figures = None
        if self.cfg.objective != "sft":
            from tunebench.trainer.pairs import evaluate_pairs

            figures = evaluate_pairs(self.ts.module, self.eval_data, self.cfg, self.data.device, self.ctx,
                                     self.held_reference)
            loss = figures["loss"]
            self.state.preference.append([done, figures])
        else:
            loss = evaluate(self.ts.module, self.eval_data, self.cfg, self.data.device, self.ctx)
        self.state.eval_curve.append([done, loss])
        target = self.cfg.target_eval_loss
        if target is not None and self.state.target_s is None and loss <= target:
            self.state.target_s = self.elapsed()
        if self.ctx.is_main and figures:
            say(f"eval: step {done}, loss {loss:.4f}, reward accuracy {figures['reward_accuracy']:.1%}, margin "
                f"{figures['reward_margin']:.4f} (chosen {figures['rewards_chosen']:.4f}, rejected "
                f"{figures['rewards_rejected']:.4f}) over {figures['pairs']:,} pairs")
            if self.trackers:
                self.trackers.log({f"eval/{k}": figures[k] for k in ("loss", "rewards_chosen", "rewards_rejected",
                                                                       "reward_margin", "reward_accuracy")}, done)
        elif self.ctx.is_main:
            say(f"eval: step {done}, loss {loss:.4f}, perplexity {math.exp(min(loss, 50)):.2f}")
            if self.trackers:
                self.trackers.log({"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 50))}, done)

    def elapsed(self) -> float:
        return self.state.elapsed_before + time.perf_counter() - self.started

    def save(self, done: int, result: LoopResult) -> None:
        state = {"step": done, "total": self.total, "epoch": self.data.pos.epoch, "micro": self.data.pos.micro,
                 "losses": self.state.history + result.losses, "eval_curve": self.state.eval_curve,
                 "target_s": self.state.target_s, "elapsed_s": self.elapsed(), "world_size": self.ctx.world_size,
                 "preference": self.state.preference,
                 "identity": self.identity}

        def parts(folder: Path) -> None:
            self.ts.state.save(folder, self.ctx)
            if self.ctx.is_main:
                torch.save(self.sched.state_dict(), folder / "scheduler.pt")

        path = checkpoint.save(self.out, done, state, parts, self.ctx, self.cfg.keep_checkpoints)
        self.state.checkpoints = [str(p) for p in checkpoint.complete(self.out)]
        if self.ctx.is_main:
            say(f"checkpoint: {path}")
