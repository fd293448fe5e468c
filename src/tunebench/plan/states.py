"""The model states' memory on one GPU: the weights (by method and strategy; a mixture of experts' apart; DPO's
frozen copy) and the optimizer's state, as plan.memory lists them."""

from __future__ import annotations

from dataclasses import dataclass

from tunebench.plan.workload import Workload

OPTIMIZER_BYTES = {"adamw": 8, "adamw_fused": 8, "adamw_8bit": 2, "paged_adamw_8bit": 2}  # state per parameter


@dataclass(frozen=True)
class Item:
    name: str
    bytes: float
    note: str = ""


def model_weights(w: Workload) -> list[Item]:
    """The weights' items: the model's own (by method and strategy) and DPO's frozen copy."""
    items = _own_weights(w)
    if w.frozen_reference:  # copied as built (cast as DeepSpeed casts the policy), sharded as it is under FSDP2
        shards = w.weights_sharded if w.collectives == "fsdp" else 1
        copy = (w.compute_bytes if w.deepspeed else w.param_bytes) * w.counts.total / shards
        items.append(Item("reference model", copy, "DPO's frozen copy" + (f", 1/{shards} shard" if shards > 1 else "")))
    return items


def _own_weights(w: Workload) -> list[Item]:
    c, cb, n = w.counts, w.compute_bytes, w.counts.total
    if w.full:
        if w.deepspeed:
            bf16 = 2 * n / (w.world if w.strategy.shards == "everything" else 1)
            weights = [Item("weights", bf16, "bf16 copy DeepSpeed computes with")]
            if not w.offloaded:  # offloaded, the masters live in host memory
                weights.append(Item("master weights", 4 * n / w.sharded, "fp32, in DeepSpeed's optimizer"))
            return weights
        what = "bf16 weights, no master copy" if w.pure else "fp32 master weights"
        return [Item("weights", w.param_bytes * n / w.sharded, what + (f", 1/{w.sharded} shard" if w.sharded > 1
                                                                        else ""))]
    adapters = Item("LoRA adapters", w.param_bytes * w.lora_params / w.sharded,
                    f"{'bf16' if w.pure else 'fp32'}, rank {w.cfg.lora_rank}")
    ws = w.weights_sharded
    shard = f", 1/{ws} shard" if ws > 1 else ""
    if w.cfg.method == "lora":
        return [Item("weights", cb * n / ws, "frozen base in the compute dtype" + shard), adapters]
    nb = c.block_linears
    if w.cfg.double_quant:  # uint8 absmax per 64 weights, fp32 absmax per 256 of those
        constants, how = nb / 64 + nb / 64 / 256 * 4, "double-quantized absmax"
    else:
        constants, how = nb / 64 * 4, "fp32 absmax per 64 weights"
    return [Item("weights", nb / 2 / ws, f"{w.cfg.quant.upper()} block linears, 4 bits" + shard),
            Item("quantization constants", constants, how + (", whole on every GPU" if ws > 1 else "")),
            Item("weights (not quantized)", cb * (n - nb) / ws, "embeddings, norms, head in the compute dtype" + shard),
            adapters]


def experts_apart(w: Workload, items: list[Item]) -> list[Item]:
    """A mixture of experts' weights item as two: the experts' share (of the 4-bit block linears for QLoRA, of every
    parameter otherwise), and the rest."""
    c = w.counts
    if not c.experts:
        return items
    out = []
    for i in items:
        if i.name != "weights":
            out.append(i)
            continue
        share = c.experts / (c.block_linears if w.cfg.method == "qlora" else c.total)
        out += [Item("weights", i.bytes * (1 - share), i.note + "; without the experts"),
                Item("expert weights", i.bytes * share, f"{w.experts.count} experts in each of {w.experts.sparse} "
                                                        f"blocks, {w.experts.active} per token")]
    return out


def optimizer_state(w: Workload) -> tuple[float, float]:
    """(allocator bytes, paged bytes) of the optimizer state on one GPU."""
    if w.offloaded:
        return 0.0, 0.0
    per = OPTIMIZER_BYTES[w.cfg.optimizer]
    if w.pure and w.cfg.optimizer in ("adamw", "adamw_fused"):  # torch's AdamW keeps its states in the params' dtype
        per = per // 2
    state = per * w.trainable / w.sharded
    return (0.0, state) if w.cfg.optimizer == "paged_adamw_8bit" else (state, 0.0)
