"""A training run's preflight: every check that needs no weights, in the launching process.

Kept apart from `runner` (which builds and trains) so that the process that only launches torchrun
imports torch and tunebench's light modules, not transformers and the engine: 2-3 s less before the
ranks start. Transformers is imported only where a check needs the model's structure (LoRA targets).
"""

from __future__ import annotations

import torch

from tunebench.choices import resolve
from tunebench.config import BNB_OPTIMIZERS, RunConfig
from tunebench.errors import UserError, invalid, require
from tunebench.methods import check_targets
from tunebench.metrics.memory import available_host_bytes
from tunebench.models.count import counts, training_floor_bytes
from tunebench.models.families import has_dense_mlp
from tunebench.models.families import refusal as family_refusal
from tunebench.models.float8 import refusal as float8_refusal
from tunebench.models.float8_frozen import takes as float8_takes
from tunebench.models.spec import resolve_model
from tunebench.preflight import Plan, nproc_per_node, resolve_device
from tunebench.strategies import STRATEGIES, check_strategy
from tunebench.units import GIB

BIG_ON_CPU = 500_000_000  # parameters: above this a CPU run is announced and its build shows progress


def preflight(cfg: RunConfig, local_rank: int = 0) -> Plan:
    """Every check that needs no weights. Raises UserError with one line naming the problem."""
    spec = resolve_model(cfg.model)
    requested, device = cfg, resolve_device(cfg.device, local_rank)
    n = counts(spec)
    cfg = resolve(cfg, STRATEGIES[cfg.strategy], device.type, n.per_block if n else None)
    if spec.max_positions and cfg.seq_len > spec.max_positions:
        raise invalid("seq_len", cfg.seq_len, f"above the model's maximum of {spec.max_positions} positions")
    if device.type == "cpu" and cfg.precision == "fp16":
        raise invalid("precision", "fp16", "fp16 training is not supported on the CPU (use bf16 or fp32)")
    if cfg.tf32 and device.type != "cuda":
        raise invalid("tf32", "true", "TF32 is a format of NVIDIA GPUs' tensor cores (use tf32 false on the CPU)")
    if cfg.tf32 and (capability := torch.cuda.get_device_capability(device)) < (8, 0):
        major, minor = capability
        raise invalid("tf32", "true", f"TF32 needs compute capability 8.0 or newer (Ampere on); "
                                      f"{torch.cuda.get_device_name(device)} has {major}.{minor}")
    if device.type == "cpu" and cfg.cuda_graphs is True:
        raise invalid("cuda_graphs", "true", "CUDA graphs need a CUDA GPU (use cuda_graphs auto or false)")
    if device.type == "cpu" and cfg.attn == "flash":
        raise invalid("attn", "flash", "flash attention needs a CUDA GPU (use sdpa)")
    nproc = nproc_per_node(cfg, device)
    if device.type == "cuda" and nproc > torch.cuda.device_count():
        raise invalid("nproc_per_node", nproc, f"only {torch.cuda.device_count()} GPUs are visible on this node")
    world = nproc * cfg.nnodes
    strategy = check_strategy(cfg, world)
    if why := family_refusal(spec.shape, cfg.method, cfg.strategy):
        raise invalid(*why)
    if device.type == "cuda" and cfg.attn == "sdpa" and spec.shape.get("attn_logit_softcapping") and cfg.dropout:
        raise invalid("dropout", cfg.dropout, "a model whose attention soft-caps its logits runs FlexAttention on "
                                              "GPUs (models.build), which has no attention dropout: use dropout 0")
    if cfg.mlp_chunk and not has_dense_mlp(spec.shape, spec.num_layers):
        raise invalid("mlp_chunk", cfg.mlp_chunk, f"{spec.name}'s blocks have no dense MLP (a mixture of experts' "
                                                  "routing reads every token of the batch)")
    if cfg.float8 != "off":  # what no GPU or package can change was refused with the strategy
        _check_float8(cfg, device)
    if cfg.method == "qlora":
        require("bitsandbytes", "method=qlora")
    if cfg.optimizer in BNB_OPTIMIZERS:
        require("bitsandbytes", f"optimizer={cfg.optimizer}")
    if cfg.attn == "flash":
        require("flash_attn", "attn=flash")
    if device.type == "cpu":
        _check_host_memory(cfg, spec, nproc)
    if cfg.method != "full":
        from tunebench.models.build import load_meta_model, quantizable_linears  # transformers: only here

        meta = load_meta_model(spec, cfg)  # no memory, no weights
        check_targets(meta, cfg.lora_targets, quantized=cfg.method == "qlora")
        if cfg.frozen_float8 and not any(float8_takes(m) for _, m in quantizable_linears(meta)):
            raise invalid("float8", cfg.float8, f"no layer of {spec.name} can compute in float8 (it takes nn.Linear "
                                                "layers with sides multiples of 16; GPT-2's are Conv1D)")
    return Plan(cfg, device, spec, world, strategy, requested)


def _check_float8(cfg: RunConfig, device: torch.device) -> None:
    if device.type == "cuda":
        why = float8_refusal(torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device))
        if why:
            raise invalid("float8", cfg.float8, why)
        from tunebench.models.build import compute_dtype  # transformers: imported only where it is needed

        if cfg.frozen_float8 and compute_dtype(cfg) != torch.bfloat16:
            raise invalid("float8", cfg.float8, "a frozen base's float8 products are written in bf16 (rowwise "
                                                "scaling): use precision bf16 and quant_compute_dtype auto or bf16")
    if not cfg.frozen_float8:  # a frozen base's float8 is ours (models.float8_frozen)
        require("torchao", f"float8={cfg.float8}", "pip install torchao")


def _check_host_memory(cfg: RunConfig, spec, nproc: int) -> None:
    """On the CPU everything lives in host memory: refuse what cannot fit before building anything."""
    c, free = counts(spec), available_host_bytes()
    if c is None or free is None:
        return
    need = training_floor_bytes(c, cfg.method, cfg.precision, cfg.optimizer) * nproc
    if need > free:
        raise UserError(f"{cfg.model} {cfg.method} on the CPU needs at least {need / GIB:.1f} GiB of host memory "
                        f"({c.total / 1e9:.2f} B parameters: weights, gradients and optimizer state, x {nproc} "
                        f"process(es)) and {free / GIB:.1f} GiB is available; use a GPU or a smaller model")


def cpu_note(plan: Plan) -> str | None:
    """What a user should know before a big model trains on the CPU (None when it is small or on a GPU)."""
    c = counts(plan.spec)
    if plan.device.type != "cpu" or c is None or c.total < BIG_ON_CPU:
        return None
    need = training_floor_bytes(c, plan.cfg.method, plan.cfg.precision, plan.cfg.optimizer)
    return (f"{plan.cfg.model} {plan.cfg.method} on the CPU: {c.total / 1e9:.2f} B parameters, at least "
            f"{need / GIB:.1f} GiB of host memory; building takes minutes and each step can take minutes too")
