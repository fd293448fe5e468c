"""The trained model out: a peft adapter (LoRA/QLoRA) or the full model, and with `merge` the base with the adapter
merged in, loadable by `AutoModelForCausalLM.from_pretrained`. Each folder holds the tokenizer with its chat
template; the full model and the merged one are saved to generate (models.save.save_for_generation: KV cache on,
the tokenizer's end and padding ids). Every folder is written aside and renamed into place.

The merge computes each adapted weight in fp32, W + scale·B·A with W cast (or dequantized, for a QLoRA base) to
fp32, and casts the sum to `merge_dtype`: one rounding, the one any bf16 copy of a weight has, where a merge in
bf16 rounds the update and the sum besides. It goes a layer at a time: the host holds the base once, in
`merge_dtype`, and one layer in fp32. An adapter on anything but a linear layer (a mixture of experts' 3-D expert
weights) is merged by peft's own merge, in `merge_dtype`.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from tunebench.dist import DistContext
from tunebench.models.save import save_for_generation, save_pretrained

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ADAPTER = "default"  # the adapter peft's get_peft_model names, the one tunebench trains


def _aside(dest: Path):
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))


def _into_place(tmp: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def write_outputs(trainable, cfg, spec, tokenizer, gen, out: Path, ctx: DistContext) -> dict[str, str]:
    """Every rank calls this (a sharded strategy gathers the weights); rank 0 writes and returns the paths.
    `gen`: the GenerationConfig the saved models generate with."""
    sd = trainable.ts.state.export(ctx)
    if not ctx.is_main:
        return {}
    model = trainable.model
    name = "model" if cfg.method == "full" else "adapter"
    tmp = _aside(out / name)
    if cfg.method == "full":
        save_for_generation(model, tmp, gen, state_dict=sd, safe_serialization=True)
    else:  # an adapter generates through the base it is loaded onto, with that base's settings
        save_pretrained(model, tmp, state_dict=sd, safe_serialization=True)
    tokenizer.save_pretrained(tmp)  # chat_template.jinja with it, where the tokenizer has a template
    paths = {name: str(_into_place(tmp, out / name))}
    if cfg.merge and cfg.method != "full":
        paths["merged"] = str(merge(model, sd, cfg, spec, tokenizer, gen, out / "merged"))
    return paths


def _fp32(model: torch.nn.Module, sd: dict[str, Any], quantized: bool):
    """`key` -> that weight of the trained model in fp32 on the CPU. A 4-bit weight (`quantized`: a QLoRA base, a
    mixture of experts' 4-bit experts among it) is dequantized to fp32 (not to its compute dtype, which would round
    it first): its packed bytes from `sd` (gathered whole by a sharding strategy) or the live layer, its quantization
    state from the weight, or from the layer where a sharding strategy keeps it (models.sharded4bit)."""
    packed: dict[str, tuple[torch.Tensor, Any]] = {}  # key -> (the live packed weight, its quantization state)
    if quantized:
        import bitsandbytes as bnb

        from tunebench.models.experts4bit import WEIGHTS, Experts4bit

        for n, m in model.named_modules():
            if isinstance(m, bnb.nn.Linear4bit):
                packed[f"{n}.weight"] = (m.weight, getattr(m.weight, "quant_state", None)
                                         or getattr(m, "quant_state", None))
            elif isinstance(m, Experts4bit):
                packed |= {f"{n}.{w}": (getattr(m, w), getattr(m, w).quant_state) for w in WEIGHTS}

    def weight(key: str) -> torch.Tensor:
        if key not in packed:
            return sd[key].to("cpu", torch.float32)
        import bitsandbytes.functional as bf

        live, state = packed[key]
        data = sd.get(key, live.data)
        if state is None or data.numel() == 0:
            raise RuntimeError(f"cannot merge: {key} has no quantization state or weights here")
        state = copy.copy(state)  # the live layer's own stays as it is
        state.dtype = torch.float32
        return bf.dequantize_4bit(data.to(state.absmax.device), state).cpu()

    return weight


def merge(model: torch.nn.Module, sd: dict[str, Any], cfg, spec, tokenizer, generation, dest: Path) -> Path:
    """The base with the adapter merged in: a fresh copy in `merge_dtype` on the CPU, each weight taken from the
    trained state `sd`, each adapted one merged in fp32 first."""
    from peft import get_peft_model
    from peft.tuners.lora import Linear, LoraLayer
    from transformers import AutoModelForCausalLM

    dtype = DTYPES[cfg.merge_dtype]
    config = copy.deepcopy(spec.hf_config)
    fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    fresh.tie_weights()  # as the trained model was built (models.build): a tied head is one tensor
    fresh = get_peft_model(fresh, model.peft_config[ADAPTER])
    wanted = fresh.state_dict()
    missing = [k for k in wanted if k not in sd]
    if missing:
        raise RuntimeError(f"cannot merge: the trained weights lack {missing[:3]}")
    weight = _fp32(model, sd, cfg.method == "qlora")
    layers = [(name, m) for name, m in fresh.named_modules() if isinstance(m, LoraLayer)]
    plain = {f"{name}.base_layer.weight": m for name, m in layers if _plain(m, Linear)}
    with torch.no_grad():
        for key, t in wanted.items():
            m = plain.get(key)
            value = weight(key) if m is None else weight(key) + _update(m, key.removesuffix("base_layer.weight"), sd)
            t.copy_(value)  # the one cast to merge_dtype
        for _, m in layers:  # any other adapter (a mixture of experts' 3-D weights): peft's merge, in merge_dtype
            if not _plain(m, Linear):
                m.merge(adapter_names=[ADAPTER])
    base = fresh.unload()  # the LoRA layers dropped, their base layers (merged above) kept
    tmp = _aside(dest)
    save_for_generation(base, tmp, generation, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    return _into_place(tmp, dest)


def _plain(layer, linear: type) -> bool:
    """A LoRA linear layer (GPT-2's Conv1D included) whose update is scale·B·A, no variant (DoRA) on it."""
    return type(layer) is linear and ADAPTER not in getattr(layer, "lora_variant", {})


def _update(layer, prefix: str, sd: dict[str, Any]) -> torch.Tensor:
    """scale·B·A of the LoRA layer whose keys start with `prefix`, in fp32, shaped as its base weight (transposed
    for a GPT-2 Conv1D, whose weight is stored in × out), as peft's own merge computes it."""
    a = sd[f"{prefix}lora_A.{ADAPTER}.weight"].to("cpu", torch.float32)
    b = sd[f"{prefix}lora_B.{ADAPTER}.weight"].to("cpu", torch.float32)
    delta = b @ a
    return (delta.T if layer.fan_in_fan_out else delta) * layer.scaling[ADAPTER]
