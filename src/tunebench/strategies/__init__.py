"""Distributed strategies: a registry of what each one is, refuses and needs; each wraps the model in its module.

A strategy is one module here with ``apply(module, blocks, cfg, device, world_size, **options) ->
TrainStep`` plus one line in STRATEGIES. The registry itself imports no torch, so input checks,
deployments and the README's method x strategy matrix (`matrix_markdown`) read it for free.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tunebench.config import BNB_OPTIMIZERS, RunConfig
from tunebench.config.run import whole_model_by_default
from tunebench.errors import UserError, require

METHODS = ("full", "lora", "qlora")


def compiles_whole_model(cfg: RunConfig) -> bool:
    """Compiling `cfg` (compile on or auto) would compile the whole model as one graph."""
    return STRATEGIES[cfg.strategy].compile_scope(cfg.model_copy(update={"compile": True})) == "model"


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str
    module: str  # tunebench.strategies.<module>.apply wraps the model
    options: Mapping[str, Any] = field(default_factory=dict)  # passed to apply
    one_process: bool = False  # exactly one process (no torch.distributed)
    refuses: Mapping[str, str] = field(default_factory=dict)  # method -> why it is refused
    # a module's parameters exist only inside its own forward (ZeRO-3 gathers them there): nothing may read them
    # from another module's forward (see fused_head, lora_siblings)
    gathers_per_module: bool = False
    deepspeed: bool = False  # runs through DeepSpeed: needs the package, shards the optimizer itself
    # compile_scope=model works: the model and its loss compiled as one graph. Under DDP dynamo cuts that graph
    # where DDP's buckets end (its DDPOptimizer), so buckets still reduce while backward runs; not under FSDP's
    # gathers or DeepSpeed's partitions, whose hooks run between blocks: blocks there.
    whole_compile: bool = False
    # builds the model on meta and makes each rank's shards only (never the whole model on one GPU): apply
    # takes `materialize`, called once the meta model is sharded
    meta_init: bool = False
    # builds the model inside the strategy module's `partitioning(cfg, world_size)` context, which partitions each
    # module's parameters as soon as it exists (DeepSpeed's zero.Init); apply takes `materialize`, which fills them
    partitioned_init: bool = False

    @property
    def fused_head(self) -> bool:
        """The fused head + loss works: the loss reads the head's weight outside the head's forward."""
        return not self.gathers_per_module

    @property
    def lora_siblings(self) -> bool:
        """LoRA siblings can run as one (methods.lora_siblings): one layer's forward reads its siblings' adapters."""
        return not self.gathers_per_module

    def partitions_at_init(self, cfg: RunConfig) -> bool:
        # a QLoRA base is built whole and packed (a quarter of bf16's bytes: 35 GiB for 70B), then partitioned:
        # bitsandbytes quantizes a weight when it moves to the GPU, which zero.Init's partitioning skips
        return self.partitioned_init and cfg.method != "qlora"

    def partitioning(self, cfg: RunConfig, world_size: int) -> Any:
        """The context the model is built in when `partitions_at_init`."""
        return importlib.import_module(f"{__name__}.{self.module}").partitioning(cfg, world_size, **self.options)

    def compile_scope(self, cfg: RunConfig) -> str | None:
        """What `compile` compiles for this run (`cfg` resolved for its device): None (eager), "blocks" or "model"."""
        if cfg.compile is not True:
            return None
        if cfg.compile_scope != "auto":
            return cfg.compile_scope
        return "model" if self.whole_compile and whole_model_by_default(cfg) else "blocks"

    def traces_whole_checkpoint(self, cfg: RunConfig) -> bool:
        """Blocks recomputed whole get their checkpoint traced inside the compiled block (ckpt_traced, compiled per
        block); float8's too (torchao's matmuls: the forward keeps only the blocks' inputs, measured on an H200;
        a frozen base's: models.float8_frozen.recomputed_product). Not where parameters are gathered inside each
        module's forward (ZeRO-3): not measured so."""
        return cfg.ckpt_traced and self.compile_scope(cfg) == "blocks" and not self.gathers_per_module

    def check(self, cfg: RunConfig, world_size: int, packages: bool = True) -> None:
        """Refuse (UserError, one line) what this strategy cannot run, before anything is built.
        `packages`: also check that the packages it needs are installed here."""
        reason = self.refuses.get(cfg.method)
        if reason:
            raise UserError(f"invalid strategy={self.name} with method={cfg.method}: {reason}")
        if self.one_process and world_size > 1:
            others = [s for s, st in STRATEGIES.items() if not st.one_process and cfg.method not in st.refuses]
            others = ", ".join(others[:-1]) + " or " + others[-1]
            raise UserError(f"invalid strategy={self.name} with {world_size} processes: use {others}")
        if cfg.compile and cfg.compile_scope == "model" and not self.whole_compile:
            raise UserError(f"invalid compile_scope=model with strategy={self.name}: its hooks run between blocks; "
                            "use compile_scope=blocks (or strategy=single or ddp)")
        if cfg.cuda_graphs is True:
            self._check_cuda_graphs(cfg)
        if self.deepspeed and cfg.precision == "bf16-pure":
            raise UserError(f"invalid precision=bf16-pure with strategy={self.name}: DeepSpeed's bf16 mode keeps fp32 "
                            "master weights in its optimizer; use precision=bf16 (it already computes in bf16)")
        if self.deepspeed and cfg.optimizer in BNB_OPTIMIZERS:
            raise UserError(f"invalid optimizer={cfg.optimizer} with strategy={self.name}: DeepSpeed shards the "
                            "optimizer itself; use adamw or adamw_fused")
        if cfg.float8 == "tensorwise" and cfg.method != "full":
            raise UserError(f"invalid float8=tensorwise with method={cfg.method}: a frozen base computes in float8 "
                            "with rowwise scales only (use float8=rowwise)")
        if cfg.frozen_float8 and cfg.grad_ckpt and cfg.compile_scope == "model":
            raise UserError(f"invalid float8={cfg.float8} with grad_ckpt and compile_scope=model: a frozen base's "
                            "float8 products would run as autograd functions inside the whole model's graph, under "
                            "Hugging Face's checkpoint, whose recompute does not reach them (use compile_scope=blocks)")
        if cfg.frozen_float8 and self.name not in ("single", "ddp"):
            raise UserError(f"invalid float8={cfg.float8} with method={cfg.method} and strategy={self.name}: a frozen "
                            "base computes in float8 under single or ddp (its weights whole on each GPU)")
        if cfg.float8 != "off" and self.deepspeed:
            raise UserError(f"invalid float8={cfg.float8}: torchao's float8 layers run under single, ddp or fsdp, "
                            f"not under DeepSpeed's {self.name}")
        if cfg.offload == "optimizer" and not self.deepspeed:
            deepspeed = " or ".join(n for n, st in STRATEGIES.items() if st.deepspeed)
            raise UserError(f"invalid offload={cfg.offload} with strategy={self.name}: the optimizer runs on the host "
                            f"under DeepSpeed ({deepspeed})")
        if cfg.offload == "activations" and self.name not in ("single", "ddp"):
            # FSDP2 frees the gathered weights' storage after each block, DeepSpeed its own way: the hooks would
            # have to tell those apart from activations; not built
            raise UserError(f"invalid offload={cfg.offload} with strategy={self.name}: activations are offloaded "
                            "under single or ddp")
        if cfg.shard_size is not None:
            if self.name != "fsdp":
                raise UserError(f"invalid shard_size={cfg.shard_size} with strategy={self.name}: groups of shards "
                                "replicating each other (HSDP) are built on FSDP2 (strategy=fsdp)")
            if world_size % cfg.shard_size:
                raise UserError(f"invalid shard_size={cfg.shard_size} with {world_size} processes: it must divide "
                                "them (groups of shard_size processes, each a replica of the model states)")
        if self.deepspeed and packages:
            require("deepspeed", f"strategy={self.name}", "pip install --no-build-isolation deepspeed")

    def _check_cuda_graphs(self, cfg: RunConfig) -> None:
        """cuda_graphs=true replays one graph of the whole model in one process: nothing else was built or measured
        (per-block graphs left CUDA graphs' fast path on an H200, no gain; under DDP its hooks run between the
        graph's pieces)."""
        why = None
        if self.name != "single":
            why = f"with strategy={self.name}: CUDA graphs replay the whole model's graph in one process (single)"
        elif cfg.compile is False:
            why = "with compile=false: CUDA graphs replay the compiled graph (use compile on or auto)"
        elif self.compile_scope(cfg.model_copy(update={"compile": True})) != "model":
            why = (f"with compile_scope={cfg.compile_scope}: CUDA graphs replay the whole model as one graph (use "
                   "compile_scope=model); per-block graphs measured no faster so")
        elif cfg.offload != "none":
            why = f"with offload={cfg.offload}: its copies to host memory run from Python, between the kernels"
        if why:
            raise UserError(f"invalid cuda_graphs=true {why}")

    def wrap(self, module: Any, blocks: Any, cfg: RunConfig, device: Any, world_size: int,
             materialize: Any = None) -> Any:
        """Wrap `module` (the model with its loss) and build its optimizer: an engine.step.TrainStep.
        `materialize` (meta_init strategies): makes the sharded meta model's values."""
        apply = importlib.import_module(f"{__name__}.{self.module}").apply
        extra = {"materialize": materialize} if self.meta_init or self.partitioned_init else {}
        return apply(module, blocks, cfg, device, world_size, **self.options, **extra)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("single", "one process, no wrapping", "single", one_process=True, whole_compile=True),
    Strategy("ddp", "PyTorch DDP: full replicas, gradients all-reduced in buckets", "ddp", whole_compile=True),
    Strategy("fsdp", "FSDP2 (fully_shard per block): parameters, gradients and optimizer state sharded", "fsdp",
             meta_init=True),
    Strategy("zero2", "DeepSpeed ZeRO-2: optimizer state and gradients sharded", "zero", {"stage": 2},
             deepspeed=True),
    Strategy("zero3", "DeepSpeed ZeRO-3: parameters sharded too", "zero", {"stage": 3},
             gathers_per_module=True, deepspeed=True, partitioned_init=True),
)}


def check_strategy(cfg: RunConfig, world_size: int) -> Strategy:
    strategy = STRATEGIES[cfg.strategy]
    strategy.check(cfg, world_size)
    return strategy


def matrix_markdown() -> str:
    """The README's method x strategy table, from the registry."""
    names = list(STRATEGIES)
    head = {"fsdp": "fsdp (FSDP2)"}
    lines = ["| method \\ strategy | " + " | ".join(head.get(n, n) for n in names) + " |",
             "|---" * (len(names) + 1) + "|"]
    for method in METHODS:
        cells = [f"refused: {STRATEGIES[n].refuses[method].split('; ')[0]}" if method in STRATEGIES[n].refuses
                 else "yes" for n in names]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
