"""Full fine-tuning: every weight trains."""

from torch import nn


def apply_full(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        p.requires_grad_(True)
    return model
