"""Put a model on the device without a detour through a checkpoint or full-precision CPU weights.

Presets (and local directories without weights) are built on the meta device, then each parameter
is created directly on the target device with random values. Quantized models (QLoRA's NF4, or
int8/nf4 for inference) get bitsandbytes layers while still on meta, quantized one at a time, so at
most one layer's bf16 weight exists at once. Local directories with safetensors go through
``from_pretrained`` (which quantizes while loading when asked).

Training and inference describe what they want as ``Weights``; ``build`` does the rest.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Literal

import torch
from accelerate import init_empty_weights
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.pytorch_utils import Conv1D

from tunebench.choices import precision_for
from tunebench.config import RunConfig
from tunebench.models.attention import sdpa_causal
from tunebench.models.experts import use_autocast_experts
from tunebench.models.shards import SafetensorsRows, Slot, base_fill, base_slots, fill_partitions, materialize_shards
from tunebench.models.spec import ModelSpec

DTYPES = {"bf16": torch.bfloat16, "bf16-pure": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ATTN_IMPL = {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"}


def attn_implementation(attn: str, config=None, device_type: str = "cpu") -> str:
    """transformers' name for `attn`: SDPA as registered by tunebench.models.attention (flash under compile too).
    SDPA cannot soft-cap attention logits (Gemma 2's: transformers' SDPA path leaves the cap out): such a model
    runs FlexAttention on a GPU, its cap a score modification inside the kernel and its causal, sliding-window and
    packed-example masks block-sparse, and the eager attention on the CPU (where FlexAttention is not compiled)."""
    if attn == "sdpa" and getattr(config, "attn_logit_softcapping", None) is not None:
        return "flex_attention" if device_type == "cuda" else "eager"
    return sdpa_causal() if attn == "sdpa" else ATTN_IMPL[attn]


Quant = Literal["nf4", "fp4", "int8"]


@dataclass(frozen=True)
class Weights:
    """How the weights are stored: dtype of unquantized parameters, and the quantization of the linears."""

    dtype: torch.dtype = torch.bfloat16
    quant: Quant | None = None
    compute_dtype: torch.dtype = torch.bfloat16  # what quantized layers compute in
    double_quant: bool = True
    attn: str = "sdpa"
    seed: int = 0
    use_cache: bool = False  # training needs no KV cache; generation does
    # what 4-bit weights are packed into: bytes, or the unquantized dtype where a strategy casts or shards every
    # parameter (DeepSpeed, FSDP2), which then leaves the packed weights as they are
    storage: torch.dtype = torch.uint8
    dropout: float | None = None  # every dropout probability of the model set to this (None: the model's own)
    # a mixture of experts' expert weights in 4 bits too (models.experts4bit); False leaves them in the compute dtype,
    # as transformers' bitsandbytes loading does
    quantize_experts: bool = True


def compute_dtype(cfg: RunConfig) -> torch.dtype:
    if cfg.method == "qlora" and cfg.quant_compute_dtype != "auto":
        return DTYPES[cfg.quant_compute_dtype]
    return DTYPES.get(cfg.precision, torch.bfloat16)  # 'auto' not yet made concrete: only shapes are asked


def train_weights(cfg: RunConfig, float_storage: bool = False) -> Weights:
    """`float_storage`: pack 4-bit weights into the precision's dtype (for a strategy that casts or shards them)."""
    # Full training keeps fp32 master weights under autocast (mixed precision), unless bf16-pure; frozen
    # LoRA/QLoRA bases are stored in the compute dtype, which halves their memory and needs no casts.
    dtype = torch.float32 if cfg.method == "full" and cfg.precision != "bf16-pure" else compute_dtype(cfg)
    storage = DTYPES.get(cfg.precision, torch.bfloat16) if float_storage else torch.uint8
    return Weights(dtype, cfg.quant if cfg.method == "qlora" else None, compute_dtype(cfg), cfg.double_quant,
                   cfg.attn, cfg.seed, storage=storage, dropout=cfg.dropout)


def _made(cfg: RunConfig, device: torch.device) -> RunConfig:
    """The config with its precision made for `device` (preflight made it already for a run: tunebench.choices)."""
    if cfg.precision == "auto":
        return cfg.model_copy(update={"precision": precision_for(device.type)})
    return cfg


def load_meta_model(spec: ModelSpec, cfg: RunConfig | Weights, device_type: str = "cpu") -> PreTrainedModel:
    """The architecture with parameters on meta (no memory) and buffers (rotary tables) real on CPU; `device_type`:
    where it will compute (attn_implementation)."""
    w = train_weights(cfg) if isinstance(cfg, RunConfig) else cfg
    return _from_config(spec, w, init_empty_weights(include_buffers=False), device_type)


DROPOUT_SUFFIXES = ("dropout", "pdrop", "dropout_prob")  # Llama's attention_dropout, GPT-2's resid_pdrop, BERT's


def model_config(config, dropout: float | None):
    """`config` with every dropout probability in it set to `dropout` (a copy; the spec's own stays as it is)."""
    if dropout is None:
        return config
    config = copy.deepcopy(config)
    for key, value in config.to_dict().items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key.endswith(DROPOUT_SUFFIXES):
            setattr(config, key, dropout)
    return config


def _from_config(spec: ModelSpec, w: Weights, context: AbstractContextManager,
                 device_type: str = "cpu") -> PreTrainedModel:
    config = model_config(spec.hf_config, w.dropout)
    with context:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation(
            w.attn, config, device_type), dtype=w.dtype)
    # from_config leaves tied heads (GPT-2, Llama-3.2) untied; the real models tie them. Outside the context:
    # init_empty_weights makes a new parameter of every one registered, which would untie them again.
    model.tie_weights()
    model.config.use_cache = w.use_cache
    use_autocast_experts(model)
    return model


def is_linear(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, Conv1D))


def quantizable_linears(model: PreTrainedModel) -> list[tuple[str, nn.Module]]:
    """Every linear layer except the output head, as bitsandbytes and peft's 'all-linear' choose."""
    head = model.get_output_embeddings()
    return [(n, m) for n, m in model.named_modules() if is_linear(m) and m is not head]


def _replace_with_quantized(model: PreTrainedModel, w: Weights, layer: type | None = None) -> None:
    """Swap the linears for bitsandbytes ones on meta (`layer`: the 4-bit class, bitsandbytes' by default), and a
    mixture of experts' experts for 4-bit ones (models.experts4bit)."""
    import bitsandbytes as bnb

    if w.quant != "int8" and w.quantize_experts:
        _replace_experts(model, w)

    layer = layer or bnb.nn.Linear4bit
    for name, lin in quantizable_linears(model):
        # Conv1D (GPT-2) stores its weight as (in, out); Linear as (out, in).
        out_f, in_f = (lin.weight.shape[1], lin.weight.shape[0]) if isinstance(lin, Conv1D) else lin.weight.shape
        if w.quant == "int8":
            q = bnb.nn.Linear8bitLt(in_f, out_f, bias=lin.bias is not None, has_fp16_weights=False, device="meta")
        else:
            q = layer(in_f, out_f, bias=lin.bias is not None, compute_dtype=w.compute_dtype,
                      compress_statistics=w.double_quant, quant_type=w.quant, quant_storage=w.storage, device="meta")
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, q)
    if w.quant == "int8":
        model.is_loaded_in_8bit = True
    else:
        model.is_loaded_in_4bit = True  # tells peft to wrap these layers with its 4-bit LoRA


def _replace_experts(model: PreTrainedModel, w: Weights) -> None:
    from tunebench.models.experts4bit import Experts4bit, is_experts

    for name, module in list(model.named_modules()):
        if is_experts(module):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, Experts4bit(module, w.compute_dtype))


def _new_param(module: nn.Module, pname: str, meta: nn.Parameter, device: torch.device, dtype: torch.dtype,
               std: float, gen: torch.Generator) -> nn.Parameter:
    t = torch.empty(meta.shape, device=device, dtype=dtype)
    base_fill(module, pname, std)(t, gen)  # as a sharded build draws it (models.shards)
    return nn.Parameter(t, requires_grad=meta.requires_grad)


def _materialize(model: PreTrainedModel, w: Weights, device: torch.device,
                 progress: Callable[[float], None] | None = None) -> None:
    """Create every meta parameter on the device, quantizing layers one at a time; `progress(fraction)` as it goes."""
    std = getattr(model.config, "initializer_range", 0.02)
    gen = torch.Generator(device=device).manual_seed(w.seed)
    done: dict[int, nn.Parameter] = {}  # tied weights (embeddings / lm_head) are created once
    total = sum(p.numel() for p in model.parameters()) or 1
    made = 0
    for module in model.modules():
        for pname, p in list(module.named_parameters(recurse=False)):
            if p.device.type != "meta":
                continue
            if id(p) in done:
                setattr(module, pname, done[id(p)])
                continue
            if pname == "weight" and type(module).__name__ in ("Linear4bit", "Linear8bitLt"):
                new = _quantized_weight(module, device, w, std, gen)
            elif type(module).__name__ == "Experts4bit":
                new = _quantized_weight(module, device, w, std, gen, p.shape)
            else:
                new = _new_param(module, pname, p, device, w.dtype, std, gen)
            done[id(p)] = new
            setattr(module, pname, new)
            made += p.numel()
            if progress:
                progress(made / total)
    model.to(device)  # the buffers (rotary tables) that were kept real on the CPU
    avoid_cpu_repack(model)


def _quantized_weight(module: nn.Module, device: torch.device, w: Weights, std: float,
                      gen: torch.Generator, shape: torch.Size | None = None) -> nn.Parameter:
    """A 4-bit (or 8-bit) weight drawn whole in the compute dtype and quantized; `shape`: a 3-D experts weight's
    (a linear layer's otherwise)."""
    import bitsandbytes as bnb

    full = torch.empty(shape or (module.out_features, module.in_features), device=device, dtype=w.compute_dtype)
    full.normal_(0.0, std, generator=gen)
    if w.quant == "int8":
        q = bnb.nn.Int8Params(full, requires_grad=False, has_fp16_weights=False)
    else:
        q = bnb.nn.Params4bit(full, requires_grad=False, quant_type=w.quant, compress_statistics=w.double_quant,
                              quant_storage=w.storage, module=module)
    return q.to(device)  # quantizes; the bf16 tensor is freed when `full` goes out of scope


def avoid_cpu_repack(model: nn.Module) -> None:
    """bitsandbytes (0.50) repacks a 4-bit weight for its AVX512-BF16 CPU kernel at the first inference
    forward; the repacking needs out_features % 32 == 0 and whole 64-element quantization blocks per row.
    Layers of other widths (tiny-llama's 176-wide MLP) keep the generic path, which computes the same product."""
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu") and (m.out_features % 32 or m.in_features % 64):
            m.support_avx512bf16_for_cpu = False


def quantization_config(w: Weights):
    """transformers' BitsAndBytesConfig for these weights (None when unquantized)."""
    if w.quant is None:
        return None
    from transformers import BitsAndBytesConfig

    if w.quant == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=w.quant, bnb_4bit_use_double_quant=w.double_quant,
                              bnb_4bit_compute_dtype=w.compute_dtype, bnb_4bit_quant_storage=w.storage)


def from_pretrained(path, w: Weights, device: torch.device) -> PreTrainedModel:
    """Load safetensors from a local directory straight onto `device`, quantizing while loading when asked."""
    import errno
    import os

    from transformers import AutoConfig

    if not os.path.isdir(path):  # it was there when the run was checked (transformers would take it for a hub id)
        raise FileNotFoundError(errno.ENOENT, "the model folder is gone (removed since the run started?)", str(path))
    config = model_config(AutoConfig.from_pretrained(path, local_files_only=True), w.dropout)
    kwargs: dict = dict(dtype=w.dtype, attn_implementation=attn_implementation(w.attn, config, device.type),
                        device_map={"": device}, local_files_only=True, config=config)
    if (q := quantization_config(w)) is not None:
        kwargs["quantization_config"] = q
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.config.use_cache = w.use_cache
    use_autocast_experts(model)
    if w.quant in ("nf4", "fp4") and w.quantize_experts:  # transformers leaves 3-D expert weights in bf16
        from tunebench.models.experts4bit import quantize_experts

        quantize_experts(model, w.compute_dtype, w.quant, w.double_quant)
    avoid_cpu_repack(model)
    return model


def build(spec: ModelSpec, w: Weights, device: torch.device,
          progress: Callable[[float], None] | None = None) -> tuple[PreTrainedModel, str]:
    """The model on `device`, and where its weights came from ('random' or 'safetensors')."""
    if spec.has_weights:
        return from_pretrained(spec.path, w, device), "safetensors"
    model = load_meta_model(spec, w, device.type)
    if w.quant:
        _replace_with_quantized(model, w)
    _materialize(model, w, device, progress)
    return model, "random"


@dataclass
class MetaBuild:
    """A model whose parameters are still on meta, and how each rank will make its shards of them."""

    model: PreTrainedModel
    weights: str  # 'random' or 'safetensors'
    slots: list[Slot]  # the base parameters, in the order an unsharded build draws them
    source: SafetensorsRows | None  # the local checkpoint's rows (None: random weights)
    # a partitioned build (ZeRO-3's zero.Init), not a meta one: the dtype an unsharded build draws the values in
    partitioned_dtype: torch.dtype | None = None

    def materialize(self, module: nn.Module, device: torch.device, seed: int) -> None:
        """Make this rank's values once the strategy has sharded (or partitioned) `module`, the model with its loss."""
        if self.partitioned_dtype is None:
            materialize_shards(module, self.slots, device, seed, self.source)
        else:
            fill_partitions(module, self.slots, device, seed, self.partitioned_dtype, self.source)


def _float8(model: PreTrainedModel, cfg: RunConfig) -> None:
    """Swap the linears for float8 ones when asked: before any slot names them or a strategy wraps them."""
    if cfg.float8 != "off" and not cfg.frozen_float8:  # a LoRA/QLoRA base: models.float8_frozen, once adapted
        from tunebench.models.float8 import to_float8

        to_float8(model, cfg.float8, fsdp_all_gather=cfg.strategy == "fsdp")


def build_meta(spec: ModelSpec, cfg: RunConfig, device: torch.device) -> MetaBuild:
    """The training model of `cfg` on meta, for a strategy that shards it before any weight exists. A QLoRA
    base gets 4-bit layers whose packed bytes are stored in the dtype the strategy computes in (models.sharded4bit)."""
    w = train_weights(_made(cfg, device), float_storage=True)
    model = load_meta_model(spec, w, device.type)
    source = SafetensorsRows(spec.path) if spec.has_weights else None
    if not w.quant:
        _float8(model, cfg)
        return MetaBuild(model, "safetensors" if source else "random", base_slots(model), source)
    from tunebench.models.sharded4bit import ShardedLinear4bit, packed_placeholders, quantized_slots

    _replace_with_quantized(model, w, ShardedLinear4bit)
    slots = quantized_slots(base_slots(model), w.compute_dtype, w.storage)
    packed_placeholders(model, w.storage)
    return MetaBuild(model, "safetensors" if source else "random", slots, source)


def build_partitioned(spec: ModelSpec, cfg: RunConfig, device: torch.device,
                      partitioning: AbstractContextManager) -> MetaBuild:
    """The training model of `cfg` built under a context that partitions each module's parameters as soon as the
    module exists (DeepSpeed's zero.Init): no rank ever holds more than one module whole. The values are not
    drawn yet: `models.shards.fill_partitions` fills each rank's partitions as an unsharded build would."""
    from transformers.initialization import no_init_weights

    w = train_weights(_made(cfg, device))
    with no_init_weights():  # Hugging Face's init would index the empty partitions (an embedding's padding row)
        model = _from_config(spec, w, partitioning, device.type)
    source = SafetensorsRows(spec.path) if spec.has_weights else None
    return MetaBuild(model, "safetensors" if source else "random", base_slots(model), source, partitioned_dtype=w.dtype)


def build_model(spec: ModelSpec, cfg: RunConfig, device: torch.device,
                progress: Callable[[float], None] | None = None,
                float_storage: bool = False) -> tuple[PreTrainedModel, str]:
    """The training model of a run configuration on `device` (`float_storage`: see train_weights)."""
    model, weights = build(spec, train_weights(_made(cfg, device), float_storage), device, progress)
    _float8(model, cfg)
    return model, weights
