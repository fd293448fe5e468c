"""Put a model on the device without a detour through a checkpoint or full-precision CPU weights.

Presets (and local directories without weights) are built on the meta device, then each parameter
is created directly on the target device with random values. For QLoRA the linear layers become
bitsandbytes ``Linear4bit`` while still on meta and are quantized one at a time, so at most one
layer's bf16 weight exists at once. Local directories with safetensors go through
``from_pretrained`` (which quantizes while loading when asked).
"""

from __future__ import annotations

import torch
from accelerate import init_empty_weights
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.pytorch_utils import Conv1D

from tunebench.config import RunConfig
from tunebench.models.spec import ModelSpec

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ATTN_IMPL = {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"}


def compute_dtype(cfg: RunConfig) -> torch.dtype:
    if cfg.method == "qlora" and cfg.quant_compute_dtype != "auto":
        return DTYPES[cfg.quant_compute_dtype]
    return DTYPES[cfg.precision]


def param_dtype(cfg: RunConfig) -> torch.dtype:
    # Full training keeps fp32 master weights under autocast (mixed precision); frozen LoRA/QLoRA
    # bases are stored in the compute dtype, which halves their memory and needs no casts.
    return torch.float32 if cfg.method == "full" else compute_dtype(cfg)


def load_meta_model(spec: ModelSpec, cfg: RunConfig) -> PreTrainedModel:
    """The architecture with parameters on meta (no memory) and buffers (rotary tables) real on CPU."""
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            spec.hf_config, attn_implementation=ATTN_IMPL[cfg.attn], dtype=param_dtype(cfg)
        )
    model.tie_weights()  # from_config leaves tied heads (GPT-2, Llama-3.2) untied; the real models tie them
    model.config.use_cache = False
    return model


def is_linear(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, Conv1D))


def quantizable_linears(model: PreTrainedModel) -> list[tuple[str, nn.Module]]:
    """Every linear layer except the output head, as bitsandbytes and peft's 'all-linear' choose."""
    head = model.get_output_embeddings()
    return [(n, m) for n, m in model.named_modules() if is_linear(m) and m is not head]


def _replace_with_4bit(model: PreTrainedModel, cfg: RunConfig) -> None:
    import bitsandbytes as bnb

    for name, lin in quantizable_linears(model):
        # Conv1D (GPT-2) stores its weight as (in, out); Linear as (out, in).
        out_f, in_f = (lin.weight.shape[1], lin.weight.shape[0]) if isinstance(lin, Conv1D) else lin.weight.shape
        q = bnb.nn.Linear4bit(in_f, out_f, bias=lin.bias is not None, compute_dtype=compute_dtype(cfg),
                              compress_statistics=cfg.double_quant, quant_type=cfg.quant,
                              quant_storage=torch.uint8, device="meta")
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, q)
    model.is_loaded_in_4bit = True  # tells peft to wrap these layers with its 4-bit LoRA


def _new_param(module: nn.Module, pname: str, meta: nn.Parameter, device: torch.device, dtype: torch.dtype,
               std: float, gen: torch.Generator) -> nn.Parameter:
    t = torch.empty(meta.shape, device=device, dtype=dtype)
    if "norm" in type(module).__name__.lower() or isinstance(module, nn.LayerNorm):
        t.fill_(1.0 if pname == "weight" else 0.0)
    elif pname == "bias":
        t.zero_()
    else:
        t.normal_(0.0, std, generator=gen)
    return nn.Parameter(t, requires_grad=meta.requires_grad)


def _materialize(model: PreTrainedModel, cfg: RunConfig, device: torch.device) -> None:
    """Create every meta parameter on the device, quantizing 4-bit layers one at a time."""
    std = getattr(model.config, "initializer_range", 0.02)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    done: dict[int, nn.Parameter] = {}  # tied weights (embeddings / lm_head) are created once
    for module in model.modules():
        for pname, p in list(module.named_parameters(recurse=False)):
            if p.device.type != "meta":
                continue
            if id(p) in done:
                setattr(module, pname, done[id(p)])
                continue
            if pname == "weight" and type(module).__name__ == "Linear4bit":
                new = _quantized_weight(module, p, device, cfg, std, gen)
            else:
                new = _new_param(module, pname, p, device, param_dtype(cfg), std, gen)
            done[id(p)] = new
            setattr(module, pname, new)
    model.to(device)  # the buffers (rotary tables) that were kept real on the CPU


def _quantized_weight(module: nn.Module, meta: nn.Parameter, device: torch.device, cfg: RunConfig,
                      std: float, gen: torch.Generator) -> nn.Parameter:
    import bitsandbytes as bnb

    full = torch.empty(module.out_features, module.in_features, device=device, dtype=compute_dtype(cfg))
    full.normal_(0.0, std, generator=gen)
    w = bnb.nn.Params4bit(full, requires_grad=False, quant_type=cfg.quant, compress_statistics=cfg.double_quant,
                          quant_storage=torch.uint8, module=module)
    return w.to(device)  # quantizes; the bf16 tensor is freed when `full` goes out of scope


def _from_pretrained(spec: ModelSpec, cfg: RunConfig, device: torch.device) -> PreTrainedModel:
    kwargs: dict = dict(dtype=param_dtype(cfg), attn_implementation=ATTN_IMPL[cfg.attn],
                        device_map={"": device}, local_files_only=True)
    if cfg.method == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=cfg.quant, bnb_4bit_use_double_quant=cfg.double_quant,
            bnb_4bit_compute_dtype=compute_dtype(cfg), bnb_4bit_quant_storage=torch.uint8)
    model = AutoModelForCausalLM.from_pretrained(spec.path, **kwargs)
    model.config.use_cache = False
    return model


def build_model(spec: ModelSpec, cfg: RunConfig, device: torch.device) -> tuple[PreTrainedModel, str]:
    """The model on `device`, and where its weights came from ('random' or 'safetensors')."""
    if spec.has_weights:
        return _from_pretrained(spec, cfg, device), "safetensors"
    model = load_meta_model(spec, cfg)
    if cfg.method == "qlora":
        _replace_with_4bit(model, cfg)
    _materialize(model, cfg, device)
    return model, "random"
