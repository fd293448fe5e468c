"""`tunebench plan --max batch|seq-len|model-size`: the largest micro-batch, sequence or model that fits.

    largest(cfg, what, gpu, world, store) -> Limit

Answered by the planner alone (nothing runs): the configuration is planned at growing sizes, doubling until the
verdict is no longer `fits` (within 95% of the GPU's memory), then bisected to the exact size. A model size is
chosen among the presets (public shapes), the configuration otherwise as given. Each answer carries its
prediction, so its tokens/s and memory come with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tunebench.api.plan import default_world, measured_hw, target_gpu
from tunebench.config import RunConfig
from tunebench.errors import UserError
from tunebench.plan import Prediction, predict

WHAT = ("batch", "seq-len", "model-size")
MAX_BATCH, MAX_SEQ = 1 << 16, 1 << 22  # searched no further (a size beyond: "at least")
SEQ_STEP = 128  # sequence lengths are answered in multiples of this (attention kernels' tiles)


@dataclass
class Limit:
    what: str
    value: int | str | None  # the largest that fits (None: not even the smallest)
    prediction: Prediction | None
    at_least: bool = False  # the search's own bound was reached: the answer is a lower bound
    note: str = ""
    tried: list[tuple[int | str, Prediction | None, str]] = field(default_factory=list)  # (size, plan, refused)
    # seq-len: the longest with the long-context levers the configuration does not use (their options, the length,
    # its plan, whether the model's positions bound it); None where they reach no further or cannot run under its
    # strategy
    longer: tuple[str, int, Prediction, bool] | None = None

    def planned(self, size: int | str | None) -> Prediction | None:
        return next((p for s, p, _ in self.tried if s == size), None) if size is not None else None


def _plan(cfg: RunConfig, gpu, world: int, hw) -> tuple[Prediction | None, str]:
    try:
        p = predict(cfg, gpu, world, hw)
    except (UserError, ValueError) as err:
        return None, str(err).splitlines()[0] if str(err) else type(err).__name__
    return p, ""


def _grow(make, lo: int, top: int, step: int, fits) -> tuple[int | None, bool]:
    """The largest size in [lo, top] (a multiple of `step`) for which fits(make(size)) holds, assuming it holds
    below any size where it holds: doubling, then bisection."""
    if not fits(make(lo)):
        return None, False
    good, size = lo, lo
    while True:
        size = min(size * 2, top)
        if not fits(make(size)):
            bad = size
            break
        good = size
        if size == top:
            return top, True
    while bad - good > step:
        mid = (good + bad) // 2 // step * step
        if mid <= good:
            break
        good, bad = (mid, bad) if fits(make(mid)) else (good, mid)
    return good, False


def largest(cfg: RunConfig, what: str, gpu: str | None = None, world: int | None = None,
            store: str | Path | None = None) -> Limit:
    """The largest `what` (batch, seq-len, model-size) of `cfg` that fits the GPU named (or this machine's)."""
    if what not in WHAT:
        raise UserError(f"invalid max={what}: choose from {', '.join(WHAT)}")
    target, detected = target_gpu(gpu)
    hw = measured_hw(store, target)
    n = world or default_world(cfg, detected)
    limit = Limit(what, None, None)

    def fits(variant: RunConfig) -> bool:
        size = {"batch": variant.batch_size, "seq-len": variant.seq_len, "model-size": variant.model}[what]
        p, refused = _plan(variant, target, n, hw)
        limit.tried.append((size, p, refused))
        return p is not None and p.verdict == "fits"

    if what == "model-size":
        return _largest_model(cfg, limit, fits)
    if what == "batch":
        value, capped = _grow(lambda b: cfg.model_copy(update={"batch_size": b}), 1, MAX_BATCH, 1, fits)
        limit.at_least = capped
    else:
        from tunebench.models.spec import resolve_model

        positions = resolve_model(cfg.model).max_positions
        top = (positions or MAX_SEQ) // SEQ_STEP * SEQ_STEP
        value, capped = _grow(lambda s: cfg.model_copy(update={"seq_len": s}), SEQ_STEP, top, SEQ_STEP, fits)
        limit.at_least = capped and not positions
        if capped and positions:
            limit.note = f"the model's own limit ({positions:,} positions): memory would allow more"
        elif not capped:
            limit.longer = _with_long_context_levers(cfg, value or 0, top, target, n, hw)
    limit.value = value
    limit.prediction = limit.planned(value)
    limit.tried.sort(key=lambda t: t[0])
    return limit


# the long-context levers, each with the option that sets it
_LEVER_FLAGS = {"grad_ckpt": "--grad-ckpt", "ckpt_every": "--ckpt-every", "ckpt_keep": "--ckpt-keep",
                "ckpt_keep_every": "--ckpt-keep-every", "compile_scope": "--compile-scope", "mlp_chunk": "--mlp-chunk",
                "offload": "--offload"}


def _with_long_context_levers(cfg: RunConfig, longest: int, top: int, gpu, world: int,
                              hw) -> tuple[str, int, Prediction, bool] | None:
    """The longest sequence with every block checkpointed, its MLP in chunks (where it has a dense one) and the
    blocks' inputs in host memory (engine.chunked_mlp, engine.offload), where that reaches further than `longest`
    and the strategy runs them. Its options: those that differ from the configuration's."""
    from tunebench.strategies import STRATEGIES
    from tunebench.tune.space import MLP_CHUNK, chunkable

    levers: dict = {"grad_ckpt": True, "ckpt_every": 1, "ckpt_keep": "input", "ckpt_keep_every": 1}
    if chunkable(cfg.model_copy(update={"compile_scope": "blocks"})):  # a whole-model graph gives way to blocks
        levers |= {"mlp_chunk": cfg.mlp_chunk or MLP_CHUNK,
                   "compile_scope": "blocks" if cfg.compile_scope == "model" else cfg.compile_scope}
    levers["offload"] = "activations"
    changed = {k: v for k, v in levers.items() if getattr(cfg, k) != v}
    if not changed or not STRATEGIES[cfg.strategy].whole_weights:
        return None
    try:
        base = RunConfig.model_validate(cfg.model_dump() | changed)
    except ValueError:
        return None
    def at(seq: int) -> RunConfig:
        return base.model_copy(update={"seq_len": seq})

    def fits(variant: RunConfig) -> bool:
        p, _ = _plan(variant, gpu, world, hw)
        return p is not None and p.verdict == "fits"

    value, capped = _grow(at, SEQ_STEP, top, SEQ_STEP, fits)
    if value is None or value <= longest:
        return None
    options = " ".join(_LEVER_FLAGS[k] if v is True else f"{_LEVER_FLAGS[k]} {v}" for k, v in changed.items())
    return options, value, _plan(at(value), gpu, world, hw)[0], capped


def _largest_model(cfg: RunConfig, limit: Limit, fits) -> Limit:
    """Every preset of the configuration's method, largest first by parameters; the first that fits."""
    from tunebench.models.presets import PRESETS
    from tunebench.plan import workload

    sized = []
    for name in PRESETS:
        try:
            sized.append((workload(cfg.model_copy(update={"model": name}), 1).counts.total, name))
        except (UserError, ValueError):
            continue
    for _, name in sorted(sized, reverse=True):
        if fits(cfg.model_copy(update={"model": name})) and limit.value is None:
            limit.value, limit.prediction = name, limit.planned(name)
    return limit
