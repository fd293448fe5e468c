"""What `tunebench tune` may change, and every configuration that results.

A *structure* fixes everything but the micro-batch: strategy and world size, checkpointing (none, every block
keeping its matmuls' outputs, one block in four or eight keeping them, every other block, every block), compile,
optimizer, float8 (full fine-tunes on GPUs with float8 tensor cores, where torchao is installed; not under
DeepSpeed), the long-context levers for the context objective (the MLP in chunks, the blocks' inputs offloaded to
the host), and the sequence length when the user lets it change (it changes the workload). Micro-batches are
powers of two; with a global batch held, the gradient accumulation follows (batch x accumulation x GPUs = global
batch) and batches that do not divide it are left out.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from tunebench.config import BNB_OPTIMIZERS, RunConfig
from tunebench.errors import UserError
from tunebench.format import kept_label
from tunebench.strategies import STRATEGIES

# (grad_ckpt, ckpt_every, ckpt_keep, ckpt_keep_every): none, op-level selective (matmuls kept), one block in four
# or in eight keeping its matmuls and the others recomputed (between the two, for a memory bound: one in eight is
# what fit Hugging Face Trainer's memory for Mistral-7B QLoRA s512 b8), every other block, full
CHECKPOINTING = ((False, 1, "input", 1), (True, 1, "matmuls", 1), (True, 1, "matmuls", 4), (True, 1, "matmuls", 8),
                 (True, 2, "input", 1), (True, 1, "input", 1))
COMPILE_WORD = {True: " compile", "auto": " compile:auto", False: ""}
LEVERS = ("strategy", "checkpointing", "compile", "optimizer", "float8", "memory", "batch")  # what --fixed can hold
MAX_BATCH = 1024
# (mlp_chunk, offload): the context objective's memory levers on a GPU. A chunk this long keeps its MLP's matmuls
# large enough for the tensor cores and its intermediates a small share of a long context's working set.
MLP_CHUNK = 8192


@dataclass(frozen=True)
class Space:
    worlds: tuple[int, ...] = (1,)
    strategies: tuple[str, ...] = ()  # empty: every strategy that accepts the method
    optimizers: tuple[str, ...] = ()  # empty: the config's own and adamw_fused
    seq_lens: tuple[int, ...] = ()  # empty: the config's own (the workload stays as given)
    compile: tuple[bool | str, ...] = (False, True)  # "auto" where the config fixes it so
    checkpointing: tuple[tuple[bool, int, str, int], ...] = CHECKPOINTING
    batches: tuple[int, ...] = ()  # empty: powers of two up to max_batch
    global_batch: int | None = None  # samples per optimizer step, held across candidates
    max_batch: int = MAX_BATCH
    float8: tuple[str, ...] = ()  # empty: the config's own, and tensorwise where the machine can (`float8_levers`)
    memory: tuple[tuple[int | None, str], ...] = ()  # (mlp_chunk, offload); empty: the config's own
    deepspeed_available: bool = True
    notes: list[str] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:  # (grad_ckpt, ckpt_every) alone: the block keeps its input only
        object.__setattr__(self, "checkpointing", tuple((*c, "input", 1)[:4] if len(c) < 3 else (*c, 1)[:4]
                                                        for c in self.checkpointing))

    def as_dict(self) -> dict:
        return {"worlds": list(self.worlds), "strategies": list(self.strategies), "optimizers": list(self.optimizers),
                "seq_lens": list(self.seq_lens), "compile": list(self.compile),
                "checkpointing": [list(c) for c in self.checkpointing], "batches": list(self.batches),
                "global_batch": self.global_batch, "max_batch": self.max_batch, "float8": list(self.float8),
                "memory": [list(m) for m in self.memory]}

    @classmethod
    def from_dict(cls, d: dict) -> Space:
        return cls(tuple(d["worlds"]), tuple(d["strategies"]), tuple(d["optimizers"]), tuple(d["seq_lens"]),
                   tuple(d["compile"]), tuple(tuple(c) for c in d["checkpointing"]), tuple(d["batches"]),
                   d["global_batch"], d["max_batch"], float8=tuple(d.get("float8", ())),  # tunes stored before them
                   memory=tuple(tuple(m) for m in d.get("memory", ())))


def _strategies(base: RunConfig, space: Space, world: int) -> list[str]:
    names = space.strategies or tuple(STRATEGIES)
    out = []
    for name in names:
        s = STRATEGIES[name]
        if cfg_refused(s, base, world) or (s.deepspeed and not space.deepspeed_available):
            continue
        out.append(name)
    return out


def cfg_refused(strategy, base: RunConfig, world: int) -> bool:
    try:
        strategy.check(base.model_copy(update={"optimizer": "adamw"}), world, packages=False)
    except UserError:
        return True
    return False


def float8_levers(base: RunConfig, fp8_gpu: bool, torchao: bool) -> tuple[str, ...]:
    """The float8 settings worth trying here: tensorwise beside the config's own for a full fine-tune on a GPU with
    float8 tensor cores (faster than bf16 where measured; rowwise less so, not tried;
    benchmarks/results/full-finetune.md), where torchao is. A LoRA/QLoRA base in float8 (rowwise, faster too) is not
    tried: its rounding is asked for."""
    if base.method == "full" and fp8_gpu and torchao:
        return tuple(dict.fromkeys((base.float8, "tensorwise")))
    return (base.float8,)


def memory_levers(base: RunConfig, objective: str) -> tuple[tuple[int | None, str], ...]:
    """The context objective's (mlp_chunk, offload) settings on a GPU: the config's own, its MLP in chunks, and
    also its saved activations in host memory (engine.chunked_mlp, engine.offload); other objectives keep the
    config's own (a chunked MLP costs a forward; it buys length, not speed). No chunks where the MLP cannot be
    chunked: a mixture of experts' only, or the whole model compiled as one graph."""
    own = (base.mlp_chunk, base.offload)
    if objective != "context" or base.offload == "optimizer":
        return (own,)
    chunk = base.mlp_chunk or (MLP_CHUNK if chunkable(base) else None)
    return tuple(dict.fromkeys((own, (chunk, base.offload), (chunk, "activations"))))


def chunkable(cfg: RunConfig) -> bool:
    """The configuration's MLPs can run in chunks: some block's is dense, and the model is not one compiled graph."""
    from tunebench.models.families import has_dense_mlp
    from tunebench.models.spec import resolve_model

    spec = resolve_model(cfg.model)
    return has_dense_mlp(spec.shape, spec.num_layers) and cfg.compile_scope != "model"


def cpu_space(space: Space) -> tuple[Space, list[str]]:
    """The levers worth a run on a machine without a GPU, and what was left out: compilation (minutes of C++ build
    per candidate, for a few percent) and the checkpointing variants that trade GPU memory for recomputation (the
    host's memory bounds nothing a GPU's does; every block checkpointed is kept, for a host short of memory).
    Levers the user chose are left as they are."""
    left_out = []
    if space.compile == (False, True):
        space, left_out = replace(space, compile=(False,)), [*left_out, "torch.compile"]
    if space.checkpointing == CHECKPOINTING:
        space = replace(space, checkpointing=(CHECKPOINTING[0], CHECKPOINTING[-1]))
        left_out.append("selective checkpointing")
    return space, left_out


def _float8(base: RunConfig, space: Space, strategy: str, world: int) -> list[str]:
    values = space.float8 or (base.float8,)
    return [v for v in values if not cfg_refused(STRATEGIES[strategy], base.model_copy(update={"float8": v}), world)]


def _memory(base: RunConfig, space: Space, strategy: str, world: int) -> list[tuple[int | None, str]]:
    values = space.memory or ((base.mlp_chunk, base.offload),)
    return [(chunk, offload) for chunk, offload in values if not cfg_refused(
        STRATEGIES[strategy], base.model_copy(update={"mlp_chunk": chunk, "offload": offload}), world)]


def _optimizers(base: RunConfig, space: Space, strategy: str) -> list[str]:
    names = space.optimizers or tuple(dict.fromkeys((base.optimizer, "adamw_fused")))
    if STRATEGIES[strategy].deepspeed:  # DeepSpeed shards the optimizer itself
        names = tuple(n for n in names if n not in BNB_OPTIMIZERS)
    return list(names)


def structures(base: RunConfig, space: Space) -> list[RunConfig]:
    """Every combination of the levers other than the micro-batch, as configs (batch and accumulation as given)."""
    out = []
    seq_lens = space.seq_lens or (base.seq_len,)
    for world in space.worlds:
        for strategy in _strategies(base, space, world):
            alone = STRATEGIES[strategy].one_process
            if alone != (world == 1) and not space.strategies:
                continue  # one GPU runs single; sharding or replicating over one GPU only adds overhead
            if alone and world > 1:
                continue
            for opt, seq, comp, (ckpt, every, keep, keep_every), f8, (chunk, offload) in itertools.product(
                    _optimizers(base, space, strategy), seq_lens, space.compile, space.checkpointing,
                    _float8(base, space, strategy, world), _memory(base, space, strategy, world)):
                if chunk and keep == "matmuls":  # the matmuls' outputs a chunked MLP exists not to keep
                    continue
                out.append(base.model_copy(update={
                    "strategy": strategy, "nproc_per_node": None if alone else world // base.nnodes,
                    "optimizer": opt, "seq_len": seq, "compile": comp, "grad_ckpt": ckpt, "ckpt_every": every,
                    "ckpt_keep": keep, "ckpt_keep_every": keep_every, "float8": f8, "mlp_chunk": chunk,
                    "offload": offload,
                    "ckpt_traced": base.ckpt_traced or not ckpt}))  # without checkpointing: the default
    if not out:
        raise UserError("nothing to tune: no strategy accepts this configuration at the world sizes asked")
    return out


def world_of(cfg: RunConfig) -> int:
    return (cfg.nproc_per_node or 1) * cfg.nnodes


def with_batch(structure: RunConfig, batch: int, space: Space) -> RunConfig | None:
    """The structure at this micro-batch (and the accumulation that holds the global batch), or None."""
    accum = structure.grad_accum
    if space.global_batch:
        per_step = batch * world_of(structure)
        if space.global_batch % per_step:
            return None
        accum = space.global_batch // per_step
    return structure.model_copy(update={"batch_size": batch, "grad_accum": accum})


def batches(space: Space) -> list[int]:
    """Candidate micro-batches: powers of two up to the limit (and to the global batch when one is held)."""
    if space.batches:
        return list(space.batches)
    top = min(space.max_batch, space.global_batch or space.max_batch)
    return [1 << k for k in range(top.bit_length()) if (1 << k) <= top]


def describe(cfg: RunConfig) -> str:
    """A candidate's name: its levers in a few words."""
    ckpt = "no ckpt" if not cfg.grad_ckpt else ("ckpt" if cfg.ckpt_every == 1 else f"ckpt 1/{cfg.ckpt_every}")
    ckpt += kept_label(cfg.ckpt_keep, cfg.ckpt_keep_every)
    return (f"{cfg.strategy} x{world_of(cfg)} b{cfg.batch_size}x{cfg.grad_accum} s{cfg.seq_len} {ckpt}"
            f"{COMPILE_WORD[cfg.compile]} {cfg.optimizer}" + ("" if cfg.float8 == "off" else f" float8:{cfg.float8}")
            + (f" mlp/{cfg.mlp_chunk}" if cfg.mlp_chunk else "") + (" +off" if cfg.offload == "activations" else ""))
