"""One training benchmark end to end: preflight -> model -> method -> strategy -> loop -> record.

``preflight`` checks everything that can be checked before a weight exists and raises UserError.
``execute`` runs on every rank. In one process it never raises for what happens after preflight:
an OOM, a crash or a NaN becomes the record's status, because a failed configuration is a result.
On several ranks an exception is raised instead, so the rank dies at once and torchrun ends the
others (the launcher then records the failure); a NaN is seen by every rank at the same step,
since the loss is averaged over ranks, so all of them stop together and report it.
"""

from __future__ import annotations

import importlib
import json
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from tunebench.config import BNB_OPTIMIZERS, RunConfig
from tunebench.engine.data import SyntheticTokens
from tunebench.engine.loop import LoopResult, optimizer_step_fn, run_loop
from tunebench.engine.loss import is_fusable
from tunebench.engine.model import CausalLMWithLoss, transformer_blocks, unwrap
from tunebench.environment import environment
from tunebench.errors import UserError, invalid
from tunebench.launch.context import SINGLE, DistContext
from tunebench.methods import apply_method, check_targets
from tunebench.metrics.aggregate import combine_ranks, rank_summary
from tunebench.metrics.flops import FlopsPerToken, flops_per_token
from tunebench.metrics.memory import peak_memory, release, reset_peak
from tunebench.metrics.telemetry import Telemetry
from tunebench.models import ModelSpec, build_model, load_meta_model, resolve_model
from tunebench.record import ResultRecord
from tunebench.strategies import apply_strategy, check_strategy

ProgressFn = Callable[[int, float | None], None]


@dataclass(frozen=True)
class Plan:
    cfg: RunConfig
    spec: ModelSpec
    device: torch.device
    world_size: int = 1


def _require(module: str, why: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # a broken install is as missing as an absent one
        raise UserError(f"{why} needs the '{module}' package, which is not installed (pip install {module})") from None


def resolve_device(choice: str, local_rank: int = 0) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise invalid("device", choice, "no CUDA GPU is visible to PyTorch on this machine (use cpu or auto)")
    return torch.device("cuda", local_rank)


def nproc_per_node(cfg: RunConfig, device: torch.device) -> int:
    """Default: every visible GPU for a distributed strategy; one process for single and on CPU."""
    if cfg.nproc_per_node:
        return cfg.nproc_per_node
    return torch.cuda.device_count() if device.type == "cuda" and cfg.strategy != "single" else 1


def preflight(cfg: RunConfig, local_rank: int = 0) -> Plan:
    """Every check that needs no weights. Raises UserError with one line naming the problem."""
    spec = resolve_model(cfg.model)
    if spec.max_positions and cfg.seq_len > spec.max_positions:
        raise invalid("seq_len", cfg.seq_len, f"above the model's maximum of {spec.max_positions} positions")
    device = resolve_device(cfg.device, local_rank)
    if device.type == "cpu" and cfg.precision == "fp16":
        raise invalid("precision", "fp16", "fp16 training is not supported on the CPU (use bf16 or fp32)")
    if device.type == "cpu" and cfg.attn == "flash":
        raise invalid("attn", "flash", "flash attention needs a CUDA GPU (use sdpa)")
    nproc = nproc_per_node(cfg, device)
    if device.type == "cuda" and nproc > torch.cuda.device_count():
        raise invalid("nproc_per_node", nproc, f"only {torch.cuda.device_count()} GPUs are visible on this node")
    world = nproc * cfg.nnodes
    check_strategy(cfg, world)
    if cfg.method == "qlora":
        _require("bitsandbytes", "method=qlora")
    if cfg.optimizer in BNB_OPTIMIZERS:
        _require("bitsandbytes", f"optimizer={cfg.optimizer}")
    if cfg.attn == "flash":
        _require("flash_attn", "attn=flash")
    if cfg.method != "full":
        check_targets(load_meta_model(spec, cfg), cfg.lora_targets)  # meta: no memory, no weights
    return Plan(cfg, spec, device, world)


@dataclass
class _Outcome:
    """What a run got to, filled in as it goes so that a failure still reports what was reached."""

    loop: LoopResult = field(default_factory=LoopResult)
    flops: FlopsPerToken | None = None
    setup_s: float | None = None
    weights: str | None = None
    params_total: int | None = None
    params_trainable: int | None = None


def _train(plan: Plan, out: _Outcome, started: float, progress: ProgressFn | None, ctx: DistContext) -> None:
    # In its own frame so that the model and optimizer are freed as soon as it returns or raises.
    cfg, spec, device = plan.cfg, plan.spec, plan.device
    model, out.weights = build_model(spec, cfg, device)
    if cfg.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = apply_method(model, cfg)
    model.train()
    head = unwrap(model).get_output_embeddings()
    blocks = transformer_blocks(model, spec.num_layers)
    if cfg.compile:
        for block in blocks:  # per block, as torchtitan does: one small graph reused L times
            block.compile()
    out.params_total = sum(p.numel() for p in model.parameters())
    out.params_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # Counted before the strategy shards anything (ZeRO-3 leaves empty partitions behind).
    fuse_head = cfg.strategy != "zero3"  # under ZeRO-3 the head's weight is gathered only by its own forward
    out.flops = flops_per_token(model, head, spec.num_layers, spec.num_heads, spec.head_dim, cfg.seq_len,
                                cfg.grad_ckpt, head_recompute=not (fuse_head and is_fusable(head)))
    module = CausalLMWithLoss(model, spec.vocab_size, fuse_head)
    ts = apply_strategy(module, blocks, cfg, device, ctx.world_size)
    data = SyntheticTokens(spec.vocab_size, cfg.batch_size, cfg.seq_len, device, cfg.seed, ctx.rank, ctx.world_size)
    step = optimizer_step_fn(ts, data, cfg, device, ctx)
    out.setup_s = time.perf_counter() - started
    telemetry = Telemetry(device.index) if device.type == "cuda" and cfg.telemetry else None
    out.loop = run_loop(step, cfg, device, progress if ctx.is_main else None, ctx, telemetry)


def execute(plan: Plan, progress: ProgressFn | None = None, started: float | None = None,
            ctx: DistContext = SINGLE, rank_file: Path | None = None, record_id: str | None = None) -> ResultRecord:
    """Run a preflighted plan on this rank; every rank returns the same combined record."""
    cfg, device = plan.cfg, plan.device
    started = time.perf_counter() if started is None else started
    env = environment(device)
    rec = ResultRecord(config=cfg.model_dump(), config_hash=cfg.config_hash(), environment=env, tags=cfg.tag)
    if record_id:  # chosen by a sweep, so that the record is written once whoever writes it
        rec.id = record_id
    out = _Outcome()
    torch.manual_seed(cfg.seed)
    reset_peak(device)
    try:
        _train(plan, out, started, progress, ctx)
        rec.status, rec.error = out.loop.status, out.loop.error
    except Exception as err:
        if ctx.world_size > 1:
            raise  # let this rank die now: torchrun stops the others, the launcher records why
        rec.status, rec.error = failure(err)
    mine = rank_summary(ctx, socket.gethostname(), out.loop, cfg, peak_memory(device))
    if rank_file:  # this rank's figures survive even if another rank dies before the gather
        rank_file.write_text(json.dumps(mine))
    rec.metrics = combine_ranks(ctx.gather(mine), cfg, out.loop.losses, out.flops, env["gpu"]["name"], device)
    rec.metrics.setup_s, rec.metrics.weights = out.setup_s, out.weights
    rec.metrics.params_total, rec.metrics.params_trainable = out.params_total, out.params_trainable
    rec.metrics.nnodes = ctx.nnodes
    release(device)
    return rec


def failure(err: BaseException) -> tuple[str, str]:
    """The status and error of a result that an exception ended (call inside the except block)."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return "oom", str(err).splitlines()[0]
    if isinstance(err, MemoryError):
        return "oom", f"host out of memory: {err}"
    return "failed", traceback.format_exc(limit=-8)[-4000:]



def run(cfg: RunConfig, progress: ProgressFn | None = None) -> ResultRecord:
    """The Python API for one process (strategy single); distributed runs go through tunebench.launch."""
    started = time.perf_counter()
    plan = preflight(cfg)
    if cfg.distributed:
        raise UserError("distributed runs start under torchrun: use tunebench.launch.torchrun.launch(cfg)")
    return execute(plan, progress, started)
