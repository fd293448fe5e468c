"""Training methods: which weights train and how the frozen base is stored."""

from torch import nn

from tunebench.config import RunConfig
from tunebench.methods.full import apply_full
from tunebench.methods.lora import apply_lora, check_targets


def apply_method(model: nn.Module, cfg: RunConfig) -> nn.Module:
    if cfg.method == "full":
        return apply_full(model)
    return apply_lora(model, cfg)  # lora and qlora differ only in how the base was built


__all__ = ["apply_method", "check_targets"]
