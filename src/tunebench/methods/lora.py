"""LoRA and QLoRA through peft. QLoRA's base is already 4-bit (models.build); here the adapters go on.

k-bit preparation is done our way rather than with peft's ``prepare_model_for_kbit_training``: the
base is frozen (peft does that), checkpointing is non-reentrant (so inputs need no grad hook), and
embeddings, norms and the head stay in the compute dtype. peft's helper upcasts all of them to fp32,
which on Mistral-7B costs about 1 GiB and a weight cast every step, for no stability gain in bf16.
"""

from __future__ import annotations

from torch import nn

from tunebench.config import RunConfig
from tunebench.errors import invalid


def _is_linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or type(m).__name__ in ("Conv1D", "Linear4bit", "Linear8bitLt")


def check_targets(model: nn.Module, targets: list[str]) -> None:
    """Refuse target names that match no linear layer (peft matches a name or a dotted suffix)."""
    if targets == ["all-linear"]:
        return
    linears = [n for n, m in model.named_modules() if n and _is_linear(m)]
    for t in targets:
        if not any(n == t or n.endswith("." + t) for n in linears):
            leaves = sorted({n.rsplit(".", 1)[-1] for n in linears})
            raise invalid("lora_targets", t, f"no linear layer has this name; linear layers are: {', '.join(leaves)} "
                                             "(or all-linear)")


def apply_lora(model: nn.Module, cfg: RunConfig) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    targets = "all-linear" if cfg.lora_targets == ["all-linear"] else cfg.lora_targets
    lcfg = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")
    # peft keeps bf16 bases' adapters in fp32 (trained under autocast); bf16-pure stores them in bf16 too
    return get_peft_model(model, lcfg, autocast_adapter_dtype=cfg.precision != "bf16-pure")
