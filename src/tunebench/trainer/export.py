"""The trained model out: a peft adapter (LoRA/QLoRA) or the full model, with the tokenizer beside it, and
with `merge` the base with the adapter merged in, in bf16, loadable by `AutoModelForCausalLM.from_pretrained`.

A QLoRA base is merged as it trained: each 4-bit weight dequantized to bf16, then the adapter added. Every
folder is written aside and renamed into place.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from tunebench.dist import DistContext
from tunebench.models.save import save_pretrained


def _aside(dest: Path):
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))


def _into_place(tmp: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def write_outputs(trainable, cfg, spec, tokenizer, out: Path, ctx: DistContext) -> dict[str, str]:
    """Every rank calls this (a sharded strategy gathers the weights); rank 0 writes and returns the paths."""
    sd = trainable.ts.state.export(ctx)
    if not ctx.is_main:
        return {}
    model = trainable.model
    name = "model" if cfg.method == "full" else "adapter"
    tmp = _aside(out / name)
    save_pretrained(model, tmp, state_dict=sd, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    paths = {name: str(_into_place(tmp, out / name))}
    if cfg.merge and cfg.method != "full":
        paths["merged"] = str(merge(model, sd, cfg, spec, tokenizer, out / "merged"))
    return paths


def _dequantized(model: torch.nn.Module, sd: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Each 4-bit weight dequantized to bf16, by its state-dict name. The packed bytes come from `sd` (gathered
    whole by a sharding strategy) or the live layer; the quantization state from the weight, or from the layer
    where a sharding strategy keeps it (models.sharded4bit)."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bf

    out = {}
    for name, m in model.named_modules():
        if not isinstance(m, bnb.nn.Linear4bit):
            continue
        state = getattr(m.weight, "quant_state", None) or getattr(m, "quant_state", None)
        packed = sd.get(f"{name}.weight", m.weight.data)
        if state is None or packed.numel() == 0:
            raise RuntimeError(f"cannot merge: {name} has no quantization state or weights here")
        out[f"{name}.weight"] = bf.dequantize_4bit(packed.to(state.absmax.device), state).to(torch.bfloat16).cpu()
    return out


def merge(model: torch.nn.Module, sd: dict[str, Any], cfg, spec, tokenizer, dest: Path) -> Path:
    """The base with the adapter merged in: a fresh bf16 copy on the CPU, the trained weights loaded, merged."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    sd = {k: v for k, v in sd.items()} | (_dequantized(model, sd) if cfg.method == "qlora" else {})
    fresh = AutoModelForCausalLM.from_config(spec.hf_config, dtype=torch.bfloat16)
    fresh = get_peft_model(fresh, model.peft_config["default"])
    wanted = fresh.state_dict()
    missing = [k for k in wanted if k not in sd]
    if missing:
        raise RuntimeError(f"cannot merge: the trained weights lack {missing[:3]}")
    fresh.load_state_dict({k: sd[k].to(torch.bfloat16).cpu() for k in wanted}, strict=True)
    merged = fresh.merge_and_unload()
    tmp = _aside(dest)
    save_pretrained(merged, tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    return _into_place(tmp, dest)
