"""LoRA targets by name, without torch: which names are linear layers (peft's target_modules) and which are a
mixture of experts' expert weights (peft's target_parameters). methods.lora applies them; the planner counts them."""

from __future__ import annotations

EXPERTS = "experts"  # lora_targets' name for a mixture of experts' expert weights (both projections)
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def split_targets(targets: list[str]) -> tuple[list[str] | str, list[str]]:
    """peft's target_modules (linear layers; 'all-linear' as it is) and target_parameters (expert weights:
    `experts` names both of a block's, `experts.gate_up_proj` or `experts.down_proj` one)."""
    params = [t for t in targets if t == EXPERTS or t.startswith(EXPERTS + ".")]
    modules = [t for t in targets if t not in params]
    expanded = [f"{EXPERTS}.{w}" for w in EXPERT_WEIGHTS] if EXPERTS in params else []
    expanded += [t for t in params if t != EXPERTS and t not in expanded]
    return ("all-linear" if modules == ["all-linear"] else modules), expanded
