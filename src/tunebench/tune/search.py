"""The search: the planner ranks every candidate, measurements correct it, real OOMs bound the batches.

Each round picks the unmeasured candidate with the best *corrected* prediction: the planner's figure
times the median measured/predicted ratio of the runs so far (so a planner that is 10% optimistic on
this machine stops misleading the ranking after one run). Candidates are skipped when

  - they cannot fit: the planner says so, shifted by what the same structure measured at a smaller
    batch (its measured - predicted memory), or a smaller batch of the same structure ran out of memory
  - they are clearly worse: corrected prediction below `prune` x the best measured objective
  - they would not finish in the time left: their expected time (the corrected prediction's steps plus the
    setup the runs so far took) exceeds it
  - they lie far outside what was measured: a batch more than EXTRAPOLATE times the largest that ran waits until
    the batches between have run (the planner's speed is least sure there, and on a CPU a far batch can take
    the whole budget)

A run is abandoned after 3 timed steps when it is slower than the best so far by more than `abandon`, or too slow
to finish in the time left (RunConfig.max_step_s), so a bad candidate costs its setup and a few steps.

The context objective grows the sequence instead of the batch: the longest length that trains wins (the faster at
equal length), and a length that ran out of memory bounds the longer ones of the same levers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from tunebench.config import RunConfig, workload_key
from tunebench.plan import Prediction
from tunebench.record import ResultRecord
from tunebench.tune.space import Space, batches, structures, with_batch, world_of

OBJECTIVES = ("throughput", "cost", "memory", "context")
EXTRAPOLATE = 4  # a batch at most this many times the largest measured one is ranked by its prediction


@dataclass(frozen=True)
class Objective:
    name: str  # throughput | cost | memory | context (the longest sequence that trains at the batch size)
    price_per_gpu_hour: float | None = None  # cost: the offering's on-demand price

    def of(self, tokens_per_s: float | None, memory: float | None, world: int) -> float | None:
        """Higher is better: tokens/s, minus $ per 1M tokens, minus peak memory per GPU."""
        if self.name == "throughput":
            return tokens_per_s or None
        if self.name == "cost":
            return -self.price_per_gpu_hour * world / (tokens_per_s * 3600) * 1e6 if tokens_per_s else None
        return -memory if memory else None

    def describe(self, value: float) -> str:
        if self.name == "throughput":
            return f"{value:,.0f} tokens/s"
        if self.name == "cost":
            return f"${-value:.3f} per 1M tokens"
        if self.name == "context":
            return f"{int(value):,} tokens of context"
        return f"{-value / 2**30:.2f} GiB peak per GPU"


@dataclass
class Candidate:
    cfg: RunConfig
    structure: int  # index of its structure
    prediction: Prediction | None
    record: ResultRecord | None = None
    seconds: float | None = None  # its run's wall time, setup included
    skipped: str | None = None  # why it was not measured
    refused: bool = False  # this machine cannot run it (a package or GPUs missing): never tried again

    @property
    def world(self) -> int:
        return world_of(self.cfg)


@dataclass
class Tuner:
    base: RunConfig
    space: Space
    objective: Objective
    predict: Callable[[RunConfig], Prediction | None]
    capacity: float | None  # bytes one GPU can hold (None: unknown, only real OOMs bound the batch)
    prune: float = 0.7
    abandon: float = 0.2
    trial_steps: int = 13  # steps a candidate runs (warmup and timed)
    candidates: list[Candidate] = field(default_factory=list)
    oom_at: dict[int, int] = field(default_factory=dict)  # structure -> smallest batch that ran out of memory
    oom_seq: dict[str, int] = field(default_factory=dict)  # context: levers but the length -> shortest that OOMed
    history: list[Candidate] = field(default_factory=list)  # measured, in the order they ran

    def __post_init__(self) -> None:
        for s, structure in enumerate(structures(self.base, self.space)):
            for b in batches(self.space):
                cfg = with_batch(structure, b, self.space)
                if cfg is not None:
                    self.candidates.append(Candidate(cfg, s, self.predict(cfg)))

    # ---- what was measured
    def observe(self, cfg: RunConfig, rec: ResultRecord, seconds: float | None = None) -> None:
        c = self._find(cfg)
        if c is None:  # the baseline, or a run outside the grid: still informs the ratio and the best
            c = Candidate(cfg, -1, self.predict(cfg))
            self.candidates.append(c)
        if c.record is None:
            self.history.append(c)
        c.record, c.seconds = rec, seconds
        self._cover_twin(cfg, rec)
        if rec.status == "oom" and self.objective.name == "context":
            self.oom_seq[_shape(cfg)] = min(cfg.seq_len, self.oom_seq.get(_shape(cfg), cfg.seq_len))
        elif rec.status == "oom" and c.structure >= 0:
            b = cfg.batch_size
            self.oom_at[c.structure] = min(b, self.oom_at.get(c.structure, b))

    def _cover_twin(self, cfg: RunConfig, rec: ResultRecord) -> None:
        """A run with `compile: auto` ran compiled or not: the grid's candidate it resolved to is that run, never run
        again (not counted as a run of its own)."""
        if cfg.compile != "auto" or rec.status not in ("ok", "oom"):
            return
        twin = self._find(cfg.model_copy(update={"compile": bool(rec.metrics.compile_scope)}))
        if twin is not None and twin.record is None:
            twin.record, twin.skipped = rec, "ran as the baseline (its compile: auto)"
            if rec.status == "oom":
                b = cfg.batch_size
                self.oom_at[twin.structure] = min(b, self.oom_at.get(twin.structure, b))

    def refuse(self, c: Candidate, why: str) -> None:
        if c not in self.candidates:
            self.candidates.append(c)
        c.refused, c.skipped = True, why

    def _find(self, cfg: RunConfig) -> Candidate | None:
        k = key(cfg)
        return next((c for c in self.candidates if key(c.cfg) == k), None)

    @property
    def measured(self) -> list[Candidate]:
        return list(self.history)

    def value(self, c: Candidate) -> float | None:
        """The objective of a measured candidate (None unless it ran ok)."""
        r = c.record
        if r is None or r.status != "ok":
            return None
        if self.objective.name == "context":  # the longer context wins; at the same length, the faster run
            return c.cfg.seq_len + min(r.metrics.tokens_per_s or 0.0, 1e8) / 1e9
        memory = r.metrics.peak_mem_allocated_bytes or r.metrics.peak_rss_bytes  # RSS on the CPU
        return self.objective.of(r.metrics.tokens_per_s, memory, c.world)

    def best(self) -> Candidate | None:
        ok = [c for c in self.measured if self.value(c) is not None]
        return max(ok, key=self.value) if ok else None

    # ---- what to measure next
    def ratio(self) -> float:
        """Median measured / predicted throughput so far (1 before any run)."""
        ratios = [c.record.metrics.tokens_per_s / c.prediction.tokens_per_s for c in self.measured
                  if c.prediction and c.record.status == "ok" and c.record.metrics.tokens_per_s]
        return statistics.median(ratios) if ratios else 1.0

    def predicted_value(self, c: Candidate) -> float | None:
        p = c.prediction
        if p is None:
            return None
        if self.objective.name == "context":
            return float(c.cfg.seq_len)
        return self.objective.of(p.tokens_per_s * self.ratio(), p.mem.peak_allocated, c.world)

    def _memory_offset(self, c: Candidate) -> float:
        """Measured - predicted peak of the same structure at its largest measured ok batch (0 if none)."""
        runs = [m for m in self.measured if m.structure == c.structure and m.prediction and m.record.status == "ok"
                and m.record.metrics.peak_mem_allocated_bytes]
        if not runs:
            return 0.0
        m = max(runs, key=lambda m: m.cfg.batch_size)
        return m.record.metrics.peak_mem_allocated_bytes - m.prediction.mem.peak_allocated

    def fits(self, c: Candidate) -> bool:
        if c.structure in self.oom_at and c.cfg.batch_size >= self.oom_at[c.structure]:
            return False
        if c.cfg.seq_len >= self.oom_seq.get(_shape(c.cfg), c.cfg.seq_len + 1):
            return False
        if self.capacity is None or c.prediction is None:
            return True
        m = c.prediction.mem
        return m.total + self._memory_offset(c) <= self.capacity

    def step_s(self, c: Candidate) -> float | None:
        """The candidate's step time: its prediction corrected by the runs so far (None before any ran)."""
        if c.prediction is None or not any(m.record.status == "ok" for m in self.measured):
            return None
        return tokens_per_step(c) / (c.prediction.tokens_per_s * self.ratio())

    def expected_s(self, c: Candidate) -> float | None:
        """Its run's expected wall time: its steps, plus the setup (start-up, build, compilation) the runs so far
        took beyond their steps (the median)."""
        step = self.step_s(c)
        if step is None:
            return None
        setups = [m.seconds - self.trial_steps * tokens_per_step(m) / m.record.metrics.tokens_per_s
                  for m in self.measured if m.seconds and m.record.status == "ok" and m.record.metrics.tokens_per_s]
        return self.trial_steps * step + max(0.0, statistics.median(setups) if setups else 0.0)

    def _size(self, cfg: RunConfig) -> int:
        """What grows in this search: the sequence for the context objective, else the micro-batch."""
        return cfg.seq_len if self.objective.name == "context" else cfg.batch_size

    def _far(self, c: Candidate) -> bool:
        ran = [self._size(m.cfg) for m in self.measured if m.record.status == "ok"]
        return bool(ran) and self._size(c.cfg) > EXTRAPOLATE * max(ran)

    def next(self, left_s: float | None = None) -> Candidate | None:
        """The candidate to run next; `left_s`: the seconds left in the budget (none is chosen that would not
        finish in them)."""
        best = self.best()
        floor = None if best is None else self.value(best)
        tried = {_twin(c.cfg) for c in self.measured}
        ranked = []
        for c in self.candidates:
            if c.record is not None or c.refused:
                continue
            if not self.fits(c):
                c.skipped = "does not fit"
                continue
            expected = self.expected_s(c)
            if left_s is not None and expected is not None and expected > left_s:
                c.skipped = f"expected to take {expected:,.0f} s, {left_s:,.0f} s left"
                continue
            if self._far(c):
                c.skipped = f"beyond {EXTRAPOLATE}x the largest that ran: after the sizes between"
                continue
            v = self.predicted_value(c)
            if floor is not None and v is not None and _worse(v, floor, self.prune):
                c.skipped = "predicted clearly worse than the best measured"
                continue
            c.skipped = None
            # a candidate that differs from a measured one only in its optimizer comes after every new option
            fresh = _twin(c.cfg) not in tried
            ranked.append((fresh, v if v is not None else float("-inf"), c.cfg.batch_size, c))
        if not ranked:
            return None
        return max(ranked, key=lambda t: t[:3])[3]

    def max_step_s(self, c: Candidate, left_s: float | None = None) -> tuple[float | None, str]:
        """A step time beyond which `c` is abandoned, and why: clearly worse than the best so far (throughput and
        cost), or too slow to finish its steps in the `left_s` seconds left."""
        bounds = []
        if left_s is not None:
            bounds.append((left_s / self.trial_steps, "too slow to finish in the time left"))
        best = self.best()
        if best is not None and self.objective.name in ("throughput", "cost"):
            best_tps = best.record.metrics.tokens_per_s
            if self.objective.name == "cost":  # same $ per token: tokens/s in proportion to the GPUs paid for
                best_tps *= c.world / best.world
            bounds.append((tokens_per_step(c) / (best_tps * (1 - self.abandon)), "clearly slower than the best"))
        return min(bounds) if bounds else (None, "")


def tokens_per_step(c: Candidate) -> int:
    return c.cfg.rows_per_micro * c.cfg.seq_len * c.cfg.grad_accum * c.world


def _shape(cfg: RunConfig) -> str:
    """A candidate's levers but its sequence length (the context objective's OOM bound)."""
    return key(cfg.model_copy(update={"seq_len": 1}))


def _twin(cfg: RunConfig) -> str:
    """The candidate with its optimizer left out (the planner tells optimizers apart by their step's bytes only,
    a few percent of a step: a measured twin says more than the prediction)."""
    return key(cfg.model_copy(update={"optimizer": "adamw"}))


def key(cfg: RunConfig) -> str:
    """A candidate's identity: the workload, not how briefly it was measured (steps, max_step_s)."""
    return workload_key(RunConfig, cfg.model_dump())


def _worse(value: float, floor: float, prune: float) -> bool:
    """`value` is clearly worse than `floor` (both higher-is-better; negative for cost and memory)."""
    return value < floor * prune if floor > 0 else value < floor / prune
