"""Distributed strategies: a registry of what each one is, refuses and needs; each wraps the model in its module.

A strategy is one module here with ``apply(module, blocks, cfg, device, world_size, **options) ->
TrainStep`` plus one row in STRATEGIES: what it is, refuses and shards, and what the planner needs of it
(PlannerFacts). The registry itself imports no torch, so input checks, deployments, the planner and the
docs' method x strategy matrix (`matrix_markdown`) read it for free.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tunebench.choices import check_cuda_graphs
from tunebench.config import BNB_OPTIMIZERS, RunConfig
from tunebench.errors import UserError, require

METHODS = ("full", "lora", "qlora")


@dataclass(frozen=True)
class PlannerFacts:
    """What the planner (tunebench.plan) knows of a strategy: the pattern of its collectives and buffers, and its
    constants fitted on the GPU records (tests/data/planner; figures in benchmarks/results/planner.md)."""

    # the collectives and buffers plan.speed and plan.memory model: none (one process), all_reduce (gradients in
    # buckets), fsdp (weights gathered per block, gradients reduce-scattered), zero2 (gradients reduce-scattered
    # through buckets, weights all-gathered after the step), zero3 (parameters fetched per module)
    collectives: Literal["none", "all_reduce", "fsdp", "zero2", "zero3"]
    reserve: float  # the allocator's reserve beyond the peak, a share of it (freed blocks kept, fragmentation)
    host_per_block_s: float  # the host's seconds per block and micro-batch, eager (calls, hooks)
    overlap: float  # the share of the compute its collectives hide behind (within a node too, but for overlap_in_node)
    compiled_blocks_host: bool  # blocks compiled apart: their host cost is calibration's host_per_compiled_block_s
    # bytes the optimizer's step moves per trained parameter, by optimizer, where they differ from calibration's
    optimizer_bytes: Mapping[str, int] = field(default_factory=dict)
    launch_gaps: float | None = None  # share of the shorter of GPU and host time that shows (None: calibration's)
    collective_latency_per_block_s: float = 0.0  # the per-block collectives' latency, on more than one GPU
    host_per_adapter_s: float = 0.0  # more host time per adapted linear and pass (hooks on every adapter module)
    whole_graph_host_per_block_s: float = 0.0  # more host time per block where the whole model is one graph
    full_step_s: float = 0.0  # host time a full fine-tune's optimizer step adds, per step (none since ZeRO-2's went)
    host_per_tensor_s: float = 0.0  # host time per trained tensor and micro-batch (DeepSpeed's gradient hooks)
    overlap_in_node: float | None = None  # ... within a node, where its records fit another share (None: overlap)


UNSHARDED_ADAMW = {"adamw": 86, "adamw_fused": 45}  # torch's AdamW over whole tensors (profiled kernels)


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str
    module: str  # tunebench.strategies.<module>.apply wraps the model
    planner: PlannerFacts  # what plan and tune need to predict it (every strategy has them: tests check)
    # what it splits over its processes: nothing (replicas), the gradients and optimizer state, or everything
    shards: Literal["nothing", "states", "everything"] = "nothing"
    hybrid: bool = False  # takes shard_size: groups of processes that shard, replicating each other (HSDP)
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

    @property
    def whole_weights(self) -> bool:
        """Each process holds the model's weights whole, as built (no sharding, no DeepSpeed casts): what a frozen
        base's float8 products and activation offload's hooks need."""
        return self.shards == "nothing" and not self.deepspeed

    def partitions_at_init(self, cfg: RunConfig) -> bool:
        # a QLoRA base is built whole and packed (a quarter of bf16's bytes), then partitioned:
        # bitsandbytes quantizes a weight when it moves to the GPU, which zero.Init's partitioning skips
        return self.partitioned_init and cfg.method != "qlora"

    def partitioning(self, cfg: RunConfig, world_size: int) -> Any:
        """The context the model is built in when `partitions_at_init`."""
        return importlib.import_module(f"{__name__}.{self.module}").partitioning(cfg, world_size, **self.options)

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
            check_cuda_graphs(cfg, self)
        if self.partitioned_init and cfg.objective == "dpo" and cfg.method == "full" and not cfg.precompute_reference:
            raise UserError(f"invalid objective=dpo with strategy={self.name} and method=full: the reference would be "
                            "a second partitioned model; set precompute_reference: true (the reference's "
                            "log-probabilities computed once by the model before it trains)")
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
        if cfg.frozen_float8 and not self.whole_weights:
            raise UserError(f"invalid float8={cfg.float8} with method={cfg.method} and strategy={self.name}: a frozen "
                            "base computes in float8 under single or ddp (its weights whole on each GPU)")
        if cfg.float8 != "off" and self.deepspeed:
            raise UserError(f"invalid float8={cfg.float8}: torchao's float8 layers run under single, ddp or fsdp, "
                            f"not under DeepSpeed's {self.name}")
        if cfg.offload == "optimizer" and not self.deepspeed:
            deepspeed = " or ".join(n for n, st in STRATEGIES.items() if st.deepspeed)
            raise UserError(f"invalid offload={cfg.offload} with strategy={self.name}: the optimizer runs on the host "
                            f"under DeepSpeed ({deepspeed})")
        if cfg.offload == "activations" and not self.whole_weights:
            # FSDP2 frees the gathered weights' storage after each block, DeepSpeed its own way: the hooks would
            # have to tell those apart from activations; not built
            raise UserError(f"invalid offload={cfg.offload} with strategy={self.name}: activations are offloaded "
                            "under single or ddp")
        if cfg.mlp_chunk and not self.whole_weights:
            # the MLP's weights are inputs of its autograd function, whole: FSDP2 and ZeRO-3 gather them per module
            raise UserError(f"invalid mlp_chunk={cfg.mlp_chunk} with strategy={self.name}: the MLP is run in chunks "
                            "under single or ddp (its weights whole on each GPU)")
        if cfg.shard_size is not None:
            if not self.hybrid:
                raise UserError(f"invalid shard_size={cfg.shard_size} with strategy={self.name}: groups of shards "
                                "replicating each other (HSDP) are built on FSDP2 (strategy=fsdp)")
            if world_size % cfg.shard_size:
                raise UserError(f"invalid shard_size={cfg.shard_size} with {world_size} processes: it must divide "
                                "them (groups of shard_size processes, each a replica of the model states)")
        if self.deepspeed and packages:
            require("deepspeed", f"strategy={self.name}", "pip install --no-build-isolation deepspeed")

    def wrap(self, module: Any, blocks: Any, cfg: RunConfig, device: Any, world_size: int,
             materialize: Any = None) -> Any:
        """Wrap `module` (the model with its loss) and build its optimizer: an engine.step.TrainStep.
        `materialize` (meta_init strategies): makes the sharded meta model's values."""
        apply = importlib.import_module(f"{__name__}.{self.module}").apply
        extra = {"materialize": materialize} if self.meta_init or self.partitioned_init else {}
        return apply(module, blocks, cfg, device, world_size, **self.options, **extra)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("single", "one process, no wrapping", "single",
             PlannerFacts("none", reserve=0.08, host_per_block_s=0.8e-3, overlap=0.0, compiled_blocks_host=True,
                          optimizer_bytes=UNSHARDED_ADAMW),
             one_process=True, whole_compile=True),
    # ddp, fsdp: overlap_in_node refit with the compute terms fitted on profiles (plan.calibration): their records,
    # all within one node, fit best with the collectives' whole time added to the step; across nodes not measured
    Strategy("ddp", "PyTorch DDP: full replicas, gradients all-reduced in buckets", "ddp",
             PlannerFacts("all_reduce", reserve=0.06, host_per_block_s=0.8e-3, overlap=0.8, compiled_blocks_host=True,
                          optimizer_bytes=UNSHARDED_ADAMW, whole_graph_host_per_block_s=1.2e-3, overlap_in_node=0.0),
             whole_compile=True),
    Strategy("fsdp", "FSDP2 (fully_shard per block): parameters, gradients and optimizer state sharded", "fsdp",
             # reserve: what FSDP2 runs reserve beyond their peak allocation (all-gather buffers freed and reused
             # block by block), fitted on the runs of plan/fitted_records.txt (benchmarks/results/planner.md)
             PlannerFacts("fsdp", reserve=0.2, host_per_block_s=2.7e-3, overlap=0.7, compiled_blocks_host=False,
                          optimizer_bytes={"adamw": 136, "adamw_fused": 95}, collective_latency_per_block_s=0.5e-3,
                          overlap_in_node=0.0),
             shards="everything", hybrid=True, meta_init=True),
    Strategy("zero2", "DeepSpeed ZeRO-2: optimizer state and gradients sharded", "zero",
             PlannerFacts("zero2", reserve=0.15, host_per_block_s=0.8e-3, overlap=0.7, compiled_blocks_host=True,
                          host_per_tensor_s=0.18e-3),
             options={"stage": 2}, shards="states", deepspeed=True),
    Strategy("zero3", "DeepSpeed ZeRO-3: parameters sharded too", "zero",
             PlannerFacts("zero3", reserve=0.2, host_per_block_s=6.2e-3, overlap=0.5, compiled_blocks_host=False,
                          launch_gaps=0.45, collective_latency_per_block_s=0.3e-3, host_per_adapter_s=2.6e-3),
             options={"stage": 3}, shards="everything", gathers_per_module=True, deepspeed=True, partitioned_init=True),
)}


def check_strategy(cfg: RunConfig, world_size: int) -> Strategy:
    strategy = STRATEGIES[cfg.strategy]
    strategy.check(cfg, world_size)
    return strategy


def matrix_markdown() -> str:
    """The method x strategy table of docs/distributed.md, from the registry."""
    names = list(STRATEGIES)
    head = {"fsdp": "fsdp (FSDP2)"}
    lines = ["| method \\ strategy | " + " | ".join(head.get(n, n) for n in names) + " |",
             "|---" * (len(names) + 1) + "|"]
    for method in METHODS:
        cells = [f"refused: {STRATEGIES[n].refuses[method].split('; ')[0]}" if method in STRATEGIES[n].refuses
                 else "yes" for n in names]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
