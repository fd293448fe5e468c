"""LoRA and QLoRA through peft. QLoRA's base is already 4-bit (models.build); here the adapters go on.

k-bit preparation is done our way rather than with peft's ``prepare_model_for_kbit_training``: the
base is frozen (peft does that), checkpointing is non-reentrant (so inputs need no grad hook), and
embeddings, norms and the head stay in the compute dtype. peft's helper upcasts all of them to fp32,
which costs an fp32 copy of those weights and a weight cast every step, for no stability gain in bf16.
"""

from __future__ import annotations

from torch import nn

from tunebench.config import RunConfig
from tunebench.config.targets import EXPERT_WEIGHTS, split_targets
from tunebench.errors import invalid
from tunebench.methods.expert_adapters import shaped_for_peft, use_grouped_expert_adapters


def _is_linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or type(m).__name__ in ("Conv1D", "Linear4bit", "Linear8bitLt")


def expert_parameters(model: nn.Module) -> list[str]:
    """The 3-D expert weights of a mixture-of-experts model, as `module.parameter` names."""
    return [f"{n}.{p}" for n, m in model.named_modules() for p, t in m.named_parameters(recurse=False)
            if t.dim() == 3 and p in EXPERT_WEIGHTS]


def check_targets(model: nn.Module, targets: list[str], quantized: bool = False) -> None:
    """Refuse target names that match no linear layer (peft matches a name or a dotted suffix), expert targets
    where the model has no experts, and on QLoRA's mixture of experts (`quantized`) the names peft would turn into
    its experts' weights."""
    modules, params = split_targets(targets)
    if params:
        found = expert_parameters(model)
        for t in params:
            if not any(f == t or f.endswith("." + t) for f in found):
                has = sorted({".".join(f.split(".")[-2:]) for f in found})
                raise invalid("lora_targets", t, "the model has no mixture-of-experts weights of this name"
                              + (f" (it has: {', '.join(has)})" if has else ""))
    if modules == "all-linear" or not modules:
        return
    if quantized and expert_parameters(model) and (named := EXPERT_NAMES_IN_PEFT.intersection(modules)):
        raise invalid("lora_targets", sorted(named)[0], "on a mixture of experts peft turns this name into the "
                                                        "experts' weights: with QLoRA name them `experts`")
    linears = [n for n, m in model.named_modules() if n and _is_linear(m)]
    for t in modules:
        if not any(n == t or n.endswith("." + t) for n in linears):
            leaves = sorted({n.rsplit(".", 1)[-1] for n in linears})
            raise invalid("lora_targets", t, f"no linear layer has this name; linear layers are: {', '.join(leaves)} "
                                             f"(or all-linear{', experts' if expert_parameters(model) else ''})")


# names peft's conversion of MoE targets (transformers 4 -> 5) turns into the experts' 3-D weights, wherever they
# stand: the experts' projections as transformers 4 named them (Mixtral's w1/w2/w3, Qwen-MoE's), which a dense layer
# of a partly sparse model shares
EXPERT_NAMES_IN_PEFT = frozenset({"w1", "w2", "w3", "gate_proj", "up_proj", "down_proj"})


def _all_linear_of_4bit_experts(model: nn.Module) -> list[str]:
    """'all-linear' where the experts are 4-bit (QLoRA): the linear layers and the routers, not the expert weights
    peft's all-linear extends to (QLoRA adapts its 4-bit experts where `experts` is named too, as in
    `all-linear,experts`, so that all-linear keeps the cost it had); without the names peft would turn into those
    experts (a partly sparse model's dense MLP layers: no adapters there, as under peft's own all-linear)."""
    head = model.get_output_embeddings()
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if n and _is_linear(m) and m is not head}
    routers = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "top_k") and hasattr(m, "weight")}
    return sorted((names - EXPERT_NAMES_IN_PEFT) | routers)


def apply_lora(model: nn.Module, cfg: RunConfig) -> nn.Module:
    """peft's LoRA. On a mixture of experts, peft's all-linear (transformers 5) also adapts the routers and the experts
    (gate_up_proj at twice the rank and alpha: the gate and up projections it fuses, as in transformers 4)."""
    import warnings

    from peft import LoraConfig, get_peft_model

    modules, params = split_targets(cfg.lora_targets)
    if modules == "all-linear" and any(type(m).__name__ == "Experts4bit" for m in model.modules()):
        modules = _all_linear_of_4bit_experts(model)
    lcfg = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=modules or [], target_parameters=params or None, bias="none",
                      task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        # peft's conversion of MoE targets sets a rank pattern for the fused experts, then warns that it matched no
        # module, while the experts' adapters do get that rank
        warnings.filterwarnings("ignore", message="The following (rank|alpha)_pattern keys did not match")
        # peft keeps bf16 bases' adapters in fp32 (trained under autocast); bf16-pure stores them in bf16 too
        with shaped_for_peft(model):  # QLoRA's 4-bit experts, adapted where `experts` is named
            model = get_peft_model(model, lcfg, autocast_adapter_dtype=cfg.precision != "bf16-pure")
    use_grouped_expert_adapters(model)
    return model
