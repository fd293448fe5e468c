"""Models bigger than one GPU: built on the meta device, sharded, then each rank makes only its own rows.

FSDP2 shards every parameter along its first dimension (``torch.chunk`` over the ranks). After
``fully_shard`` on the meta model, ``materialize_shards`` allocates the local shards and fills them, one
parameter at a time, so that no rank ever holds more than its shards plus one parameter:

- random weights (presets): each full parameter is drawn on the device in the order and from the
  generator of an unsharded build (``tunebench.models.build``), its rows kept, the rest freed. Every
  strategy therefore starts from the same weights, and losses compare across strategies;
- local safetensors: only the rank's row range of each tensor is read from the (memory-mapped) file;
- 4-bit weights (QLoRA, ``models.sharded4bit``): each weight is drawn or read whole, quantized on the device,
  and the rank keeps its rows of the packed bytes (the quantization state, small, stays whole on every rank).

ZeRO-3 builds the model inside DeepSpeed's ``zero.Init`` instead (``build.build_partitioned``), which partitions
each module's parameters as the module is made; ``fill_partitions`` then fills each rank's chunk of every
flattened parameter from the same whole draws (or the checkpoint).

LoRA adapters are drawn the same way on every path (``init_adapters``): A kaiming-uniform as peft does,
B zero, from a generator of their own, so a sharded LoRA run starts where an unsharded one does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tunebench.errors import UserError

ADAPTER_SEED_OFFSET = 1_000_003  # the adapters' generator: apart from the base weights' one
# a fused experts weight (transformers 5) -> the per-expert weights a published checkpoint holds, in the order fused
EXPERT_LAYOUTS = {"gate_up_proj": (("w1", "w3"), ("gate_proj", "up_proj")), "down_proj": (("w2",), ("down_proj",))}


@dataclass(frozen=True)
class Quantized:
    """A weight stored packed: made whole in `dtype` with `shape`, then `pack` returns the bytes to shard."""

    shape: torch.Size
    dtype: torch.dtype
    pack: Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Slot:
    """One parameter to make: where it lives and how its values are drawn."""

    module: nn.Module
    name: str  # the parameter's name in its module
    key: str  # its name in the model: the checkpoint's key
    fill: Callable[[torch.Tensor, torch.Generator], None]  # draws a full tensor's values in place
    quantized: Quantized | None = None  # the parameter holds packed 4-bit bytes of this weight


def _normal(std: float) -> Callable[[torch.Tensor, torch.Generator], None]:
    return lambda t, gen: t.normal_(0.0, std, generator=gen)


def _constant(value: float) -> Callable[[torch.Tensor, torch.Generator], None]:
    return lambda t, gen: t.fill_(value)


def _kaiming(t: torch.Tensor, gen: torch.Generator) -> None:
    nn.init.kaiming_uniform_(t, a=math.sqrt(5), generator=gen)  # peft's lora_A: nn.Linear's default


def base_fill(module: nn.Module, pname: str, std: float) -> Callable[[torch.Tensor, torch.Generator], None]:
    """How a preset's parameter is drawn: norms one (their biases zero), biases zero, the rest N(0, std)."""
    if "norm" in type(module).__name__.lower() or isinstance(module, nn.LayerNorm):
        return _constant(1.0 if pname == "weight" else 0.0)
    if pname == "bias":
        return _constant(0.0)
    return _normal(std)


def base_slots(model: nn.Module) -> list[Slot]:
    """Every parameter of the (meta) model in the order an unsharded build draws them; tied ones once."""
    std = getattr(getattr(model, "config", None), "initializer_range", 0.02)
    seen: set[int] = set()
    slots = []
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            slots.append(Slot(module, pname, f"{mname}.{pname}" if mname else pname, base_fill(module, pname, std)))
    return slots


def adapter_slots(model: nn.Module) -> list[Slot]:
    """peft's LoRA matrices in module order: A kaiming-uniform, B zero."""
    slots = []
    for mname, module in model.named_modules():
        for side, fill in (("lora_A", _kaiming), ("lora_B", _constant(0.0))):
            for adapter, linear in getattr(module, side, {}).items():
                for pname, _ in linear.named_parameters(recurse=False):
                    slots.append(Slot(linear, pname, f"{mname}.{side}.{adapter}.{pname}", fill))
    return slots


def init_adapters(model: nn.Module, seed: int, device: torch.device) -> None:
    """Draw the adapters of an unsharded model, as `materialize_shards` draws them sharded."""
    gen = torch.Generator(device=device).manual_seed(seed + ADAPTER_SEED_OFFSET)
    with torch.no_grad():
        for slot in adapter_slots(model):
            _make_rows(slot, gen, device)


def _rows(p: torch.Tensor) -> tuple[int, int]:
    """This rank's row range of a parameter FSDP2 sharded on dim 0 (torch.chunk's split)."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(p, DTensor):
        return 0, p.shape[0] if p.dim() else 0
    placements = list(p.placements)  # [Shard(0)], or under HSDP [Replicate(), Shard(0)]
    if p.dim() == 0 or placements.count(Shard(0)) != 1 or any(not (q.is_shard(0) or q.is_replicate())
                                                              for q in placements):
        raise ValueError(f"cannot make a shard placed as {p.placements}")
    dim = placements.index(Shard(0))
    world, rank = p.device_mesh.size(dim), p.device_mesh.get_local_rank(dim)
    per = math.ceil(p.shape[0] / world)
    start = min(p.shape[0], rank * per)
    return start, min(p.shape[0], start + per)


class SafetensorsRows:
    """Row ranges of a local model's tensors, read from its memory-mapped safetensors files."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        index = folder / "model.safetensors.index.json"
        files = (sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
                 if index.is_file() else sorted(folder.glob("*.safetensors")))
        self._where: dict[str, object] = {}
        for f in files:
            handle = safe_open(str(f), framework="pt", device="cpu")
            self._where.update({k: handle for k in handle.keys()})

    def _find(self, key: str) -> str | None:
        return next((k for k in (key, key.removeprefix("model."), "model." + key) if k in self._where), None)

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        found = self._find(key)
        if found is not None:
            return self._where[found].get_slice(found)[start:stop]
        experts = self._experts_rows(key, start, stop)
        if experts is not None:
            return experts
        raise UserError(f"the model's safetensors have no tensor {key!r}: a checkpoint of another architecture?")

    def _experts_rows(self, key: str, start: int, stop: int) -> torch.Tensor | None:
        """A mixture of experts' weights as transformers 5 holds them (3-D, experts first; the router under `mlp`),
        from a checkpoint in the layout the models were published in (and transformers 5 still saves): one 2-D
        weight per expert and projection (Mixtral's w1/w3/w2 under `block_sparse_moe`, Qwen-MoE's
        gate_proj/up_proj/down_proj), gate and up concatenated as transformers fuses them. Rows: experts."""
        container, sep, weight = key.rpartition(".experts.")
        parents = [container, container.rsplit(".", 1)[0] + ".block_sparse_moe"] if sep else []
        if not sep and key.endswith(".mlp.gate.weight"):  # Mixtral's router
            found = self._find(key.removesuffix(".mlp.gate.weight") + ".block_sparse_moe.gate.weight")
            return None if found is None else self._where[found].get_slice(found)[start:stop]
        for parent in parents:
            for names in EXPERT_LAYOUTS.get(weight, ()):
                # a rank with no experts (more ranks than experts) reads expert 0's shape, and no rows of it
                experts = range(start, stop) if stop > start else range(0, 1)
                keys = [[self._find(f"{parent}.experts.{e}.{n}.weight") for n in names] for e in experts]
                if all(k is not None for ks in keys for k in ks):
                    rows = torch.stack([torch.cat([self._where[k].get_tensor(k) for k in ks]) for ks in keys])
                    return rows if stop > start else rows[:0]
        return None


def materialize_shards(module: nn.Module, slots: list[Slot], device: torch.device, seed: int,
                       source: SafetensorsRows | None = None) -> None:
    """Allocate the sharded (meta) `module` on `device` and fill each rank's rows: base `slots` from `source`
    or drawn as an unsharded build would, then the adapters."""
    buffers = [(m, n, b) for m in module.modules() for n, b in m.named_buffers(recurse=False) if b is not None]
    module.to_empty(device=device)
    for m, n, b in buffers:  # rotary tables were computed on the CPU: keep their values, not empty memory
        m._buffers[n] = b.to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for slot in slots:
            _make_rows(slot, gen, device, source)
    init_adapters(module, seed, device)


def fill_partitions(module: nn.Module, slots: list[Slot], device: torch.device, seed: int, dtype: torch.dtype,
                    source: SafetensorsRows | None = None) -> None:
    """Fill each rank's partitions of a model built under DeepSpeed's zero.Init (``build_partitioned``), then
    draw the adapters (whole: DeepSpeed partitions them as it starts).

    ZeRO-3 keeps, of every parameter flattened, the rank's chunk of ``ds_tensor.numel()`` elements (the last one
    padded). Each whole tensor is drawn in `dtype` from the generator of an unsharded build, or read from `source`,
    one at a time, and the rank copies its chunk: every strategy starts from the same weights."""
    import torch.distributed as dist

    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for slot in slots:
            p = getattr(slot.module, slot.name)
            part = p.ds_tensor
            if source is not None:
                full = source.rows(slot.key, 0, p.ds_shape[0]).to(device=device)
            else:
                full = torch.empty(p.ds_shape, device=device, dtype=dtype)
                slot.fill(full, gen)
            start = part.numel() * dist.get_rank(group=p.ds_process_group)
            mine = full.reshape(-1)[start:start + part.numel()]
            part.zero_()  # the padding
            part[:mine.numel()].copy_(mine)
    init_adapters(module, seed, device)


def _make_rows(slot: Slot, gen: torch.Generator, device: torch.device, source: SafetensorsRows | None = None) -> None:
    """Fill this rank's rows of one parameter (all of it when unsharded): read from `source`, or drawn whole
    and sliced, so the values never depend on how many ranks share it."""
    p = getattr(slot.module, slot.name)
    local = p.to_local() if hasattr(p, "to_local") else p
    start, stop = _rows(p)
    if slot.quantized is not None:  # the whole weight made and quantized, its packed rows kept
        q = slot.quantized
        if source is not None:
            full = source.rows(slot.key, 0, q.shape[0]).to(device=device, dtype=q.dtype)
        else:
            full = torch.empty(q.shape, device=device, dtype=q.dtype)
            slot.fill(full, gen)
        local.copy_(q.pack(full)[start:stop])
    elif source is not None:
        local.copy_(source.rows(slot.key, start, stop))
    elif local.shape == p.shape:  # unsharded: draw in place
        slot.fill(local, gen)
    else:
        full = torch.empty(p.shape, device=device, dtype=local.dtype)
        slot.fill(full, gen)
        local.copy_(full[start:stop])
