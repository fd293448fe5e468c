"""One training benchmark on one rank: preflight -> model -> method -> strategy -> loop -> record.

``run_preflight.preflight`` checks everything that can be checked before a weight exists and raises UserError.
``execute`` runs on every rank. In one process it never raises for what happens after preflight:
an OOM, a crash or a NaN becomes the record's status, because a failed configuration is a result.
On several ranks an exception is raised instead, so the rank dies at once and torchrun ends the
others (the launcher then records the failure); a NaN is seen by every rank at the same step,
since the loss is averaged over ranks, so all of them stop together and report it.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from tunebench.choices import compile_scope, reference_in_policy_graph, traces_whole_checkpoint
from tunebench.config import RunConfig
from tunebench.console import say
from tunebench.console.progress import ProgressFn
from tunebench.dist import SINGLE, DistContext
from tunebench.engine.chunked_mlp import chunk_mlps
from tunebench.engine.data import SyntheticPairs, SyntheticTokens
from tunebench.engine.loop import LoopResult, LoopSpec, run_loop
from tunebench.engine.loss import is_fusable
from tunebench.engine.model import CausalLMWithLoss, count_params, transformer_blocks, unwrap
from tunebench.engine.preference import FrozenReference, Preference, PreferenceLM
from tunebench.engine.recompute import (
    checkpoint_every,
    checkpointed_whole,
    keep_matmuls,
    no_input_grads,
    recompute_traced,
    recomputed_share,
    recomputes_traced,
    traces_checkpoint,
)
from tunebench.engine.step import TrainStep, kernel_settings, optimizer_step_fn
from tunebench.environment import environment
from tunebench.errors import invalid
from tunebench.methods import apply_method
from tunebench.methods.adapter_gate import AdapterGate
from tunebench.methods.lora_siblings import group_siblings
from tunebench.metrics.aggregate import combine_ranks, rank_figures
from tunebench.metrics.compile import compile_seconds
from tunebench.metrics.flops import FlopsPerToken, flops_per_token, peak_flops
from tunebench.metrics.memory import peak_memory, release, reset_peak
from tunebench.metrics.telemetry import Telemetry
from tunebench.models import build_model
from tunebench.models.build import build_meta, build_partitioned, compute_dtype
from tunebench.models.count import counts
from tunebench.models.experts4bit import mark_recomputed
from tunebench.models.float8_frozen import to_float8_frozen
from tunebench.models.nf4 import all_fusable, fuse_dequantization
from tunebench.models.shards import init_adapters
from tunebench.preflight import Plan
from tunebench.record import JobFigures, RankFigures, ResultRecord
from tunebench.run_preflight import BIG_ON_CPU
from tunebench.status import failure
from tunebench.strategies import Strategy


def _build_progress(name: str) -> Callable[[float], None]:
    """Lines on stderr while a big model is built (every tenth of its parameters)."""
    shown = [0]

    def show(fraction: float) -> None:
        if int(fraction * 10) > shown[0]:
            shown[0] = int(fraction * 10)
            say(f"{name}: built {shown[0] * 10}% of the parameters")

    return show


@dataclass
class Outcome:
    """What a run got to, filled in as it goes so that a failure still reports what was reached."""

    loop: LoopResult = field(default_factory=LoopResult)
    flops: FlopsPerToken | None = None
    setup_s: float | None = None
    compile_scope: str | None = None  # what ran: None (eager), "blocks" or "model"
    cuda_graphs: bool = False  # the whole model's graph replayed as CUDA graphs
    weights: str | None = None
    params_total: int | None = None
    params_trainable: int | None = None
    job: JobFigures | None = None  # a training job's own figures


@dataclass
class Trainable:
    """The model ready to train: built, its method applied, wrapped by its strategy with its optimizer."""

    model: nn.Module  # the Hugging Face model (a peft model for LoRA/QLoRA), unwrapped
    module: CausalLMWithLoss  # the model with its loss: what the strategy wrapped
    ts: TrainStep


def build_trainable(plan: Plan, out: Outcome, ctx: DistContext, masked_labels: bool = False,
                    per_row: int = 1) -> Trainable:
    """The benchmark's and the training job's one way to build what trains (figures noted in `out`). `per_row`:
    preference pairs a packed row pair holds at most."""
    cfg, spec, device, strategy = plan.cfg, plan.spec, plan.device, plan.strategy
    n = counts(spec)
    big = device.type == "cpu" and n is not None and n.total >= BIG_ON_CPU
    meta = None  # sharded or partitioned before any weight exists
    if strategy.meta_init:
        meta = build_meta(spec, cfg, device)
    elif strategy.partitions_at_init(cfg):
        meta = build_partitioned(spec, cfg, device, strategy.partitioning(cfg, ctx.world_size))
    if meta:
        model, out.weights = meta.model, meta.weights
    else:
        # DeepSpeed casts every parameter to its dtype: a 4-bit base packed into that dtype comes through intact
        model, out.weights = build_model(spec, cfg, device, progress=_build_progress(spec.name) if big else None,
                                         float_storage=strategy.deepspeed)
    frozen = frozen_copy(model, meta) if needs_frozen_reference(cfg) else None  # before anything adapts the model
    scope = out.compile_scope = compile_scope(cfg, strategy)
    if cfg.grad_ckpt:
        _checkpointed(model, cfg, strategy, spec.num_layers)
    model = apply_method(model, cfg)
    if cfg.grad_ckpt and cfg.method != "full":
        no_input_grads(unwrap(model).get_input_embeddings())
    if cfg.method != "full" and not meta:
        init_adapters(model, cfg.seed, device)  # as a sharded build draws them: every strategy starts alike
    model.train()
    head = unwrap(model).get_output_embeddings()
    blocks = transformer_blocks(model, spec.num_layers)
    if cfg.method != "full":
        _adapted_base(model, blocks, head, cfg, scope, strategy)
    if cfg.mlp_chunk and not chunk_mlps(blocks, cfg.mlp_chunk):
        raise invalid("mlp_chunk", cfg.mlp_chunk, f"{spec.name}'s blocks have no dense MLP (a mixture of experts' "
                      "routing reads every token of the batch)")
    if scope == "blocks":
        for block in blocks:  # per block, as torchtitan does: one small graph reused L times
            block.compile()
    out.params_total, out.params_trainable = count_params(model)
    # Counted before the strategy shards anything (ZeRO-3 leaves empty partitions behind).
    fused = strategy.fused_head and is_fusable(head)
    out.flops = flops_per_token(model, head, spec.num_layers, spec.num_heads, spec.head_dim, cfg.seq_len,
                                recomputed_share(blocks), head_recompute=not fused)
    module = _with_loss(plan, model, out, ctx, masked_labels, per_row, frozen)
    if scope == "model":  # embeddings, blocks, final norm and the loss: one graph, fused across block edges
        out.cuda_graphs = cfg.cuda_graphs is True  # its passes replayed: one launch each, not one per kernel
        module.compile(**({"mode": "reduce-overhead"} if out.cuda_graphs else {}))
    materialize = functools.partial(meta.materialize, module, device, cfg.seed) if meta else None
    return Trainable(model, module, strategy.wrap(module, blocks, cfg, device, ctx.world_size, materialize))


def _checkpointed(model: nn.Module, cfg: RunConfig, strategy: Strategy, num_layers: int) -> None:
    """The model's blocks recomputed in backward as the config says (HF's checkpoint, every n-th block, matmuls kept,
    or the recompute traced into the compiled block): the policy's, and a frozen copy run through its graphs."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    blocks = transformer_blocks(model, num_layers)
    checkpoint_every(blocks, cfg.ckpt_every)
    if cfg.ckpt_keep == "matmuls":
        keep_matmuls(blocks, cfg.ckpt_keep_every)
    if traces_whole_checkpoint(cfg, strategy):
        # not around 4-bit layers kept in another dtype (FSDP2, DeepSpeed): bitsandbytes' autograd functions,
        # inside which a traced checkpoint marks nothing for recompute (their matmuls' outputs would be kept)
        recompute_traced([b for b in blocks if cfg.method != "qlora" or all_fusable(b)])


def _with_loss(plan: Plan, model: nn.Module, out: Outcome, ctx: DistContext, masked_labels: bool, per_row: int,
               frozen) -> nn.Module:
    """The model and its objective's loss as the one module the strategy wraps; DPO's frozen reference placed beside
    it, and its forward counted in the FLOPs (the adapters disabled are a forward of the base as well)."""
    cfg, spec, strategy = plan.cfg, plan.spec, plan.strategy
    if not cfg.preference:
        return CausalLMWithLoss(model, spec.vocab_size, strategy.fused_head, masked_labels)
    in_graph = reference_in_policy_graph(cfg, strategy)
    reference = None
    if frozen is not None:
        reference = reference_model(frozen, cfg, strategy, plan.device, ctx.world_size, spec.num_layers,
                                    out.compile_scope, in_graph)
    if cfg.objective == "dpo" and not cfg.precompute_reference:
        out.flops = out.flops.with_reference_forward()
    gate = AdapterGate(model) if in_graph and cfg.method != "full" else None
    return PreferenceLM(model, spec.vocab_size, Preference.of(cfg), strategy.fused_head, per_row, reference, gate,
                        in_graph)


def needs_frozen_reference(cfg: RunConfig) -> bool:
    """DPO's reference as a frozen copy: full fine-tuning (no adapters to disable) without precomputed
    log-probabilities."""
    return cfg.objective == "dpo" and cfg.method == "full" and not cfg.precompute_reference


def frozen_copy(model: nn.Module, meta) -> nn.Module | object:
    """The model as built, copied before checkpointing, a method or a strategy touches it: the copy itself, or for a
    model on meta a MetaBuild of the copy (its own slots, drawn as the policy's are: the same weights; its names are
    the policy's, both models held as `model`)."""
    import copy

    from tunebench.models.build import MetaBuild
    from tunebench.models.shards import base_slots

    if meta is None:
        return copy.deepcopy(model)
    twin = copy.deepcopy(meta.model)
    return MetaBuild(twin, meta.weights, base_slots(twin), meta.source)


def reference_model(frozen, cfg: RunConfig, strategy: Strategy, device: torch.device, world_size: int,
                    num_layers: int, scope: str | None, in_graph: bool = False) -> FrozenReference:
    """DPO's frozen reference, placed as the policy is: whole on each process (single, ddp, zero2) or sharded per
    block like the policy (fsdp: gathered block by block in its forward, freed after), its blocks compiled where the
    policy's are. `in_graph`: it runs the policy's compiled graphs (choices.reference_in_policy_graph), so its blocks
    are checkpointed as the policy's and its weights marked as trained (a graph's guards read both), though no
    gradient ever reaches them; without, it runs its own graphs without gradients."""
    from tunebench.models.build import MetaBuild

    model = frozen.model if isinstance(frozen, MetaBuild) else frozen
    if in_graph:
        if cfg.grad_ckpt:
            _checkpointed(model, cfg, strategy, num_layers)
        model.train().requires_grad_(True)
    else:
        model.eval().requires_grad_(False)
    if strategy.deepspeed and cfg.precision in ("bf16", "fp16"):
        # DeepSpeed casts the policy's parameters and runs it without autocast: the copy cast alike, or its forward
        # runs in fp32; its buffers left in fp32 as DeepSpeed leaves the policy's (RoPE's inverse frequencies cast
        # to bf16 turn every position's angle)
        for p in model.parameters():
            p.data = p.data.to(compute_dtype(cfg))
    blocks = transformer_blocks(model, num_layers)
    if cfg.mlp_chunk:  # its forward without gradients, a chunk at a time: no MLP-wide tensor of every token
        chunk_mlps(blocks, cfg.mlp_chunk)
    holder = FrozenReference(model)
    if strategy.shards == "everything":
        from tunebench.strategies.fsdp import shard_frozen

        shard_frozen(holder, blocks, cfg, device, world_size)
        if isinstance(frozen, MetaBuild):
            frozen.materialize(holder, device, cfg.seed)
        model.requires_grad_(in_graph)
    if scope == "blocks":
        for block in blocks:
            block.compile()
    return holder


def _adapted_base(model: nn.Module, blocks: list[nn.Module], head: nn.Module, cfg: RunConfig, scope: str | None,
                  strategy: Strategy) -> None:
    """How a LoRA/QLoRA model's frozen base and adapters compute: 4-bit dequantization in the graph, float8
    products, siblings run as one."""
    if cfg.method == "qlora" and (scope or cfg.frozen_float8):
        for block in blocks:  # the dequantization in the compiled graph (models.nf4): where measured faster
            mark_recomputed(block, traces_checkpoint(block))  # an MoE's 4-bit experts: plain ops there
            if cfg.frozen_float8 or traces_checkpoint(block) or not checkpointed_whole(block):
                fuse_dequantization(block, recomputed=recomputes_traced(block), float8=cfg.frozen_float8)
    converted = sum(bool(getattr(m, "float8", False)) for b in blocks for m in b.modules())
    if cfg.frozen_float8 and cfg.method == "lora":
        converted = to_float8_frozen(blocks, head, recomputed=recomputes_traced)
    if cfg.frozen_float8 and not converted:  # not silently bf16 under a float8 label
        raise invalid("float8", cfg.float8, "no frozen layer of this model computes in float8 (it takes nn.Linear "
                                            "layers with sides multiples of 16: GPT-2's are Conv1D)")
    if cfg.lora_fused and strategy.lora_siblings:
        for block in blocks:
            # not where compile traces a checkpoint (ours, keeping matmuls or recomputing whole, or Hugging Face's
            # inside the whole model's graph): dynamo refuses the siblings' hand-over there and gives the graph up
            traced_checkpoint = traces_checkpoint(block) or (scope == "model" and checkpointed_whole(block))
            if not (scope and traced_checkpoint):
                group_siblings(block)


def telemetry_for(plan: Plan) -> Telemetry | None:
    return Telemetry(plan.device.index) if plan.device.type == "cuda" and plan.cfg.telemetry else None


def synthetic_data(plan: Plan, ctx: DistContext) -> SyntheticTokens | SyntheticPairs:
    """The batches `run` times: pairs of answers for a preference objective (carrying reference log-probabilities
    where they are precomputed), rows of tokens otherwise."""
    cfg, vocab = plan.cfg, plan.spec.vocab_size
    if cfg.preference:
        return SyntheticPairs(vocab, cfg.batch_size, cfg.seq_len, plan.device, cfg.seed, ctx.rank, ctx.world_size,
                              reference=cfg.objective == "dpo" and cfg.precompute_reference)
    return SyntheticTokens(vocab, cfg.batch_size, cfg.seq_len, plan.device, cfg.seed, ctx.rank, ctx.world_size)


def _train(plan: Plan, out: Outcome, started: float, progress: ProgressFn | None, ctx: DistContext) -> None:
    # In its own frame so that the model and optimizer are freed as soon as it returns or raises.
    cfg, device = plan.cfg, plan.device
    t = build_trainable(plan, out, ctx)
    data = synthetic_data(plan, ctx)
    step = optimizer_step_fn(t.ts, data, cfg, device, ctx)
    out.setup_s = time.perf_counter() - started
    with kernel_settings(cfg, device):
        out.loop = run_loop(step, LoopSpec(cfg.steps, cfg.warmup, fault=cfg.fault, max_step_s=cfg.max_step_s),
                            device, progress if ctx.is_main else None, ctx, telemetry_for(plan))


def execute(plan: Plan, progress: ProgressFn | None = None, started: float | None = None, ctx: DistContext = SINGLE,
            on_rank_figures: Callable[[RankFigures], None] | None = None) -> ResultRecord:
    """Run a preflighted plan on this rank; every rank returns the same combined record.

    `on_rank_figures` gets this rank's own figures as soon as its loop ends, before the ranks
    combine theirs, so a run whose other ranks die still leaves what this one measured.
    """
    return attempt(plan, lambda out, t0: _train(plan, out, t0, progress, ctx), started, ctx, on_rank_figures)


def attempt(plan: Plan, work: Callable[[Outcome, float], None], started: float | None, ctx: DistContext,
            on_rank_figures: Callable[[RankFigures], None] | None = None) -> ResultRecord:
    """`work` on this rank, then the record: a failure in one process is the record's status; on several
    ranks it is raised (torchrun ends the others and the launcher records why)."""
    cfg, device = plan.cfg, plan.device
    started = time.perf_counter() if started is None else started
    env = environment(device)
    rec = ResultRecord.for_config(plan.requested or cfg, env)
    out = Outcome()
    compiled_before = compile_seconds()
    torch.manual_seed(cfg.seed)
    reset_peak(device)
    try:
        work(out, started)
        rec.status, rec.error = out.loop.status, out.loop.error
    except Exception as err:
        if ctx.world_size > 1:
            raise  # let this rank die now: torchrun stops the others, the launcher records why
        rec.status, rec.error = failure(err)
    # a sample is a pair under a preference objective: its two rows' tokens
    mine = rank_figures(ctx.rank, socket.gethostname(), out.loop.step_times, out.loop.wall_s,
                        cfg.batch_size * cfg.grad_accum, cfg.seq_len * cfg.rows_per_micro // cfg.batch_size,
                        peak_memory(device, out.cuda_graphs),
                        out.loop.telemetry)
    if on_rank_figures:
        on_rank_figures(mine)
    peak = peak_flops(env["gpu"]["name"]) if device.type == "cuda" else None
    rec.metrics = combine_ranks(ctx.gather(mine), out.loop.losses, out.flops, peak)
    rec.metrics.setup_s, rec.metrics.weights = out.setup_s, out.weights
    if out.compile_scope and compiled_before is not None:
        # compiling happens in the first (untimed) steps: counted in setup, shown apart, never in step times
        rec.metrics.compile_s = (compile_seconds() or 0.0) - compiled_before
        rec.metrics.setup_s = (out.setup_s or 0.0) + rec.metrics.compile_s
    rec.metrics.compile_scope = out.compile_scope
    rec.metrics.cuda_graphs = out.cuda_graphs or None
    rec.metrics.params_total, rec.metrics.params_trainable = out.params_total, out.params_trainable
    rec.metrics.nnodes, rec.metrics.precision, rec.metrics.job = ctx.nnodes, cfg.precision, out.job
    rec.metrics.stopped_early = out.loop.abandoned or None
    release(device)
    return rec
