"""float8 training (torchao): the blocks' linear layers compute their three matmuls in float8 on Hopper-class GPUs.

Master weights, gradients and optimizer state stay as they were (fp32 or bf16): each matmul casts its inputs to
float8 with a scale per tensor ("tensorwise") or per row ("rowwise", finer, slower to cast) and accumulates in
higher precision. The output head and layers whose sides are not multiples of 16 stay in bf16, as torchtitan
leaves them. Under FSDP2 with tensorwise scaling the weights are all-gathered in float8 (half the bytes), their
scales computed once per step for every shard together (`precompute_scales`).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (sm_89) and Hopper (sm_90) onwards


def refusal(capability: tuple[int, int], name: str) -> str | None:
    """Why a GPU of this compute capability cannot train in float8 (None: it can)."""
    if tuple(capability) >= MIN_CAPABILITY:
        return None
    return (f"float8 matmuls need compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada, "
            f"Hopper, Blackwell); {name} has {capability[0]}.{capability[1]}: use float8=off")


def _convertible(module: nn.Module, head: nn.Module | None) -> bool:
    return (type(module) is nn.Linear and module is not head
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def to_float8(model: nn.Module, recipe: str, fsdp_all_gather: bool) -> int:
    """Swap the blocks' linear layers for torchao's Float8Linear (the weights kept as they are); returns how many."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if recipe == "tensorwise" and fsdp_all_gather:
        config = replace(config, enable_fsdp_float8_all_gather=True)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    chosen = {id(m) for m in model.modules() if _convertible(m, head)}
    if not chosen:
        raise ValueError("float8 found no nn.Linear layer with sides that are multiples of 16 to convert")
    convert_to_float8_training(model, config=config, module_filter_fn=lambda m, _fqn: id(m) in chosen)
    return len(chosen)


def precompute_scales(module: nn.Module) -> None:
    """After each optimizer step under FSDP2 with float8 all-gather: every weight's scale in one all-reduce."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(module)
