"""One training benchmark end to end: preflight -> model -> method -> loop -> metrics -> record.

``preflight`` checks everything that can be checked before a weight exists and raises UserError;
``run`` never raises for what happens after that: an OOM, a crash or a NaN becomes the record's
status, because a failed configuration is a result.
"""

from __future__ import annotations

import gc
import importlib
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from tunebench.config import BNB_OPTIMIZERS, RunConfig
from tunebench.engine.data import SyntheticTokens
from tunebench.engine.loop import LoopResult, make_step, run_loop
from tunebench.engine.loss import causal_lm_loss, is_fusable
from tunebench.engine.optim import build_optimizer
from tunebench.environment import environment
from tunebench.errors import UserError, invalid
from tunebench.methods import apply_method, check_targets
from tunebench.metrics.flops import FlopsPerToken, flops_per_token, peak_flops, utilization
from tunebench.metrics.memory import peak_memory, reset_peak
from tunebench.metrics.stats import summarize
from tunebench.models import ModelSpec, build_model, load_meta_model, resolve_model
from tunebench.record import ResultRecord, StepTimes, TrainMetrics

ProgressFn = Callable[[int, float | None], None]


@dataclass(frozen=True)
class Plan:
    cfg: RunConfig
    spec: ModelSpec
    device: torch.device


def _require(module: str, why: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # a broken install is as missing as an absent one
        raise UserError(f"{why} needs the '{module}' package, which is not installed (pip install {module})") from None


def resolve_device(choice: str) -> torch.device:
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise invalid("device", choice, "no CUDA GPU is visible to PyTorch on this machine (use cpu or auto)")
    return torch.device("cuda", torch.cuda.current_device())


def preflight(cfg: RunConfig) -> Plan:
    """Every check that needs no weights. Raises UserError with one line naming the problem."""
    spec = resolve_model(cfg.model)
    if spec.max_positions and cfg.seq_len > spec.max_positions:
        raise invalid("seq_len", cfg.seq_len, f"above the model's maximum of {spec.max_positions} positions")
    device = resolve_device(cfg.device)
    if device.type == "cpu" and cfg.precision == "fp16":
        raise invalid("precision", "fp16", "fp16 training is not supported on the CPU (use bf16 or fp32)")
    if device.type == "cpu" and cfg.attn == "flash":
        raise invalid("attn", "flash", "flash attention needs a CUDA GPU (use sdpa)")
    if cfg.method == "qlora":
        _require("bitsandbytes", "method=qlora")
    if cfg.optimizer in BNB_OPTIMIZERS:
        _require("bitsandbytes", f"optimizer={cfg.optimizer}")
    if cfg.attn == "flash":
        _require("flash_attn", "attn=flash")
    if cfg.method != "full":
        check_targets(load_meta_model(spec, cfg), cfg.lora_targets)  # meta: no memory, no weights
    return Plan(cfg, spec, device)


def _unwrap(model: nn.Module) -> nn.Module:
    """The Hugging Face model inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _compile_blocks(hf: nn.Module, num_layers: int) -> None:
    # Per block, as torchtitan does: one small graph reused L times, and checkpointing still applies.
    for mod in hf.base_model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == num_layers:
            for block in mod:
                block.compile()
            return


def _metrics(cfg: RunConfig, plan: Plan, loop: LoopResult, flops: FlopsPerToken | None,
             gpu_name: str | None) -> TrainMetrics:
    world = 1
    m = TrainMetrics(world_size=world, losses=loop.losses,
                     loss_first=loop.losses[0] if loop.losses else None,
                     loss_last=loop.losses[-1] if loop.losses else None)
    if loop.step_times and loop.wall_s > 0:
        samples = len(loop.step_times) * cfg.batch_size * cfg.grad_accum * world
        tokens = samples * cfg.seq_len
        m.timed_steps, m.timed_tokens, m.wall_s = len(loop.step_times), tokens, loop.wall_s
        m.tokens_per_s = tokens / loop.wall_s
        m.tokens_per_s_per_gpu = m.tokens_per_s / world
        m.samples_per_s = samples / loop.wall_s
        m.samples_per_s_per_gpu = m.samples_per_s / world
        m.step_time_s = StepTimes(**summarize(loop.step_times))
    if flops:
        m.flops_per_token, m.hfu_flops_per_token, m.flops_formula = flops.model, flops.hardware, flops.formula
        m.peak_flops = peak_flops(gpu_name) if plan.device.type == "cuda" else None
        if m.tokens_per_s_per_gpu:
            m.mfu = utilization(flops.model, m.tokens_per_s_per_gpu, m.peak_flops)
            m.hfu = utilization(flops.hardware, m.tokens_per_s_per_gpu, m.peak_flops)
    return m


@dataclass
class _Outcome:
    """What a run got to, filled in as it goes so that a failure still reports what was reached."""

    loop: LoopResult = field(default_factory=LoopResult)
    flops: FlopsPerToken | None = None
    setup_s: float | None = None
    weights: str | None = None
    params_total: int | None = None
    params_trainable: int | None = None


def _train(plan: Plan, out: _Outcome, started: float, progress: ProgressFn | None) -> None:
    # In its own frame so that the model and optimizer are freed as soon as it returns or raises.
    cfg, spec, device = plan.cfg, plan.spec, plan.device
    model, out.weights = build_model(spec, cfg, device)
    if cfg.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = apply_method(model, cfg)
    model.train()
    hf = _unwrap(model)
    backbone, head = hf.base_model, hf.get_output_embeddings()
    if cfg.compile:
        _compile_blocks(hf, spec.num_layers)
    params = [p for p in model.parameters() if p.requires_grad]
    out.params_total = sum(p.numel() for p in model.parameters())
    out.params_trainable = sum(p.numel() for p in params)
    out.flops = flops_per_token(model, head, spec.num_layers, spec.num_heads, spec.head_dim, cfg.seq_len,
                                cfg.grad_ckpt, head_recompute=not is_fusable(head))
    optimizer = build_optimizer(params, cfg)
    data = SyntheticTokens(spec.vocab_size, cfg.batch_size, cfg.seq_len, device, cfg.seed)

    def loss_fn(ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = backbone(input_ids=ids, use_cache=False).last_hidden_state
        return causal_lm_loss(hidden, head, labels, spec.vocab_size)

    step = make_step(loss_fn, params, optimizer, data, cfg, device)
    out.setup_s = time.perf_counter() - started
    out.loop = run_loop(step, cfg, device, progress)


def execute(plan: Plan, progress: ProgressFn | None = None, started: float | None = None) -> ResultRecord:
    """Run a preflighted plan. Never raises for failures inside the run: they become the status."""
    cfg, spec, device = plan.cfg, plan.spec, plan.device
    started = time.perf_counter() if started is None else started
    env = environment(device)
    rec = ResultRecord(config=cfg.model_dump(), config_hash=cfg.config_hash(), environment=env, tags=cfg.tag)
    out = _Outcome()
    torch.manual_seed(cfg.seed)
    reset_peak(device)
    try:
        _train(plan, out, started, progress)
        rec.status, rec.error = out.loop.status, out.loop.error
    except torch.cuda.OutOfMemoryError as err:
        rec.status, rec.error = "oom", str(err).splitlines()[0]
    except MemoryError as err:
        rec.status, rec.error = "oom", f"host out of memory: {err}"
    except Exception:
        rec.status, rec.error = "failed", traceback.format_exc(limit=-8)[-4000:]
    rec.metrics = _metrics(cfg, plan, out.loop, out.flops, env["gpu"]["name"])
    rec.metrics.setup_s, rec.metrics.weights = out.setup_s, out.weights
    rec.metrics.params_total, rec.metrics.params_trainable = out.params_total, out.params_trainable
    for k, v in peak_memory(device).items():
        setattr(rec.metrics, k, v)
    _release(device)
    return rec


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run(cfg: RunConfig, progress: ProgressFn | None = None) -> ResultRecord:
    """The Python API: validate, run one benchmark, return its record (not stored; see Store.save)."""
    started = time.perf_counter()
    return execute(preflight(cfg), progress, started)
