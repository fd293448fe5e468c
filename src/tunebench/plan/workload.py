"""What a configuration asks of one GPU, from its config and the model's shape alone (no torch).

The planner's questions (how many bytes, how many FLOPs) all start from here: the parameter counts,
which of them train, how the weights are stored, and in what dtype the activations flow. The dtypes
follow what the engine does (tunebench.models.build, tunebench.strategies):

  full on single/ddp   fp32 master weights under bf16 autocast: the residual stream is fp32
  full on fsdp         FSDP2 casts the weights to bf16 for compute (fp32 shards): a bf16 stream, autocast
  full on zero2/zero3  DeepSpeed holds bf16 weights (fp32 masters in its optimizer), no autocast
  lora / qlora         the frozen base in bf16 (QLoRA: NF4 block linears), fp32 adapters, autocast
  precision bf16-pure  weights (adapters too), gradients and AdamW's states in bf16, no autocast: a bf16 stream
  precision fp32       everything fp32, no autocast
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunebench.choices import compile_scope, reference_in_policy_graph, resolve, traces_whole_checkpoint
from tunebench.config import RunConfig
from tunebench.config.targets import split_targets
from tunebench.errors import UserError
from tunebench.models.count import Counts, Linear, counts
from tunebench.models.families import Experts, Family, experts_of, family_of, known
from tunebench.models.families import refusal as family_refusal
from tunebench.models.spec import ModelSpec, resolve_model
from tunebench.strategies import STRATEGIES, Strategy

BlockKind = Literal["llama", "gpt2"]


@dataclass(frozen=True)
class Workload:
    cfg: RunConfig  # precision made concrete for a GPU
    spec: ModelSpec
    counts: Counts
    strategy: Strategy
    world: int  # GPUs in the run
    family: BlockKind  # the block's layout the formulas follow: Llama-style decoders, or GPT-2
    targets: tuple[Linear, ...]  # one block's linears that get LoRA adapters (empty for full)
    evaluates: bool = False  # a train job that evaluates on held-out rows between its steps
    arch: Family | None = None  # the model family (models.families): norms, q/k norms, soft-capping, experts
    experts: Experts | None = None  # a mixture of experts' experts
    # LoRA ranks per target, as peft gives them (its all-linear doubles the rank of an MoE's fused gate_up experts)
    target_ranks: tuple[int, ...] = ()

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch on one GPU (a preference objective's: both answers' rows of every pair)."""
        return self.cfg.rows_per_micro * self.cfg.seq_len

    @property
    def reference_forward(self) -> bool:
        """DPO's reference runs forward on every micro-batch (not precomputed): the frozen copy, or the base with
        the adapters disabled."""
        return self.cfg.objective == "dpo" and not self.cfg.precompute_reference

    @property
    def reference_runs_adapters(self) -> bool:
        """DPO's reference forward is the policy's compiled one, its adapters' rank-r products run and scaled by
        zero (choices.reference_in_policy_graph)."""
        return self.reference_forward and not self.full and reference_in_policy_graph(self.cfg, self.strategy)

    @property
    def frozen_reference(self) -> bool:
        """DPO's reference is a frozen copy of the model (full fine-tuning): its weights on the GPU too."""
        return self.reference_forward and self.full

    @property
    def layers(self) -> int:
        return self.spec.num_layers

    @property
    def full(self) -> bool:
        return self.cfg.method == "full"

    @property
    def checkpointed_blocks(self) -> int:
        """Blocks whose forward runs again in backward (runner.checkpoint_every: blocks 0, N, 2N, ...)."""
        return -(-self.layers // self.cfg.ckpt_every) if self.cfg.grad_ckpt else 0

    @property
    def checkpointed_share(self) -> float:
        return self.checkpointed_blocks / self.layers

    @property
    def kept_share(self) -> float:
        """Checkpointed blocks under ckpt_keep=matmuls' policy (one in ckpt_keep_every of the checkpointed ones,
        engine.recompute.keep_matmuls): they keep attention's and the adapters' outputs, and their matmuls'
        where `keeps_matmuls`."""
        if self.cfg.ckpt_keep != "matmuls":
            return 0.0
        return -(-self.checkpointed_blocks // self.cfg.ckpt_keep_every) / self.layers

    @property
    def recomputed_share(self) -> float:
        """Blocks whose matmuls run again in backward: the checkpointed ones, but for those that keep their
        matmuls' outputs (ckpt_keep=matmuls: only the elementwise ops between them run again)."""
        return self.checkpointed_share - (self.kept_share if self.keeps_matmuls else 0.0)

    @property
    def recompute_traced(self) -> bool:
        """Blocks recomputed whole have their checkpoint traced inside the compiled block (choices.
        traces_whole_checkpoint; QLoRA where its 4-bit linears are plain ops, as for keeps_matmuls)."""
        if not (self.cfg.grad_ckpt and traces_whole_checkpoint(self.cfg, self.strategy)):
            return False
        return self.cfg.method != "qlora" or self.fusable_4bit

    @property
    def traced_share(self) -> float:
        """Blocks recomputed whole inside backward's compiled graph (recompute_traced)."""
        return self.recomputed_share if self.recompute_traced else 0.0

    @property
    def whole_graph(self) -> bool:
        """The model and its loss compiled as one graph (compile_scope model, or auto where it means that)."""
        return compile_scope(self.cfg, self.strategy) == "model"

    @property
    def cuda_graphs(self) -> bool:
        """The whole graph's passes replayed as CUDA graphs (cuda_graphs, made concrete for a GPU)."""
        return self.whole_graph and self.cfg.cuda_graphs is True

    @property
    def fusable_4bit(self) -> bool:
        """QLoRA's 4-bit linears can be plain ops in a compiled block (models.nf4: uint8 weights, i.e. not under
        FSDP2 or DeepSpeed, which store them in another dtype)."""
        return self.cfg.compile is True and self.whole_modules

    @property
    def keeps_matmuls(self) -> bool:
        """Checkpointed blocks keep their large matmuls' outputs. QLoRA's only where its 4-bit linears are plain
        ops in the compiled block (models.nf4: compiled, uint8 weights, i.e. not FSDP2 or DeepSpeed); elsewhere they
        run inside bitsandbytes' autograd function, which compile's recompute cannot split, so they rerun and only
        attention's and the adapters' outputs are kept."""
        if self.cfg.ckpt_keep != "matmuls":
            return False
        return self.cfg.method != "qlora" or self.fusable_4bit

    def blocks_with(self, t: Linear) -> int:
        """Blocks that hold the layer `t` (an MoE's experts and routers: its sparse blocks)."""
        return self.experts.sparse if self.experts and t.kind != "linear" else self.layers

    @property
    def ranks(self) -> tuple[int, ...]:
        """Each target's LoRA rank, in the order of `targets`."""
        return self.target_ranks or (self.cfg.lora_rank,) * len(self.targets)

    @property
    def lora_params(self) -> int:
        return sum(self.blocks_with(t) * r * (t.fan_in + t.fan_out) * t.copies
                   for t, r in zip(self.targets, self.ranks))

    @property
    def active_lora_params(self) -> int:
        """Adapter weights one token multiplies by: an MoE's experts' adapters, k of E."""
        return sum(self.blocks_with(t) * r * (t.fan_in + t.fan_out) * t.active
                   for t, r in zip(self.targets, self.ranks))

    @property
    def chunked_mlp(self) -> int:
        """Tokens a dense block's MLP runs on at a time, keeping only its input (engine.chunked_mlp); 0: whole."""
        return 0 if self.experts else min(self.cfg.mlp_chunk or 0, self.tokens)

    @property
    def residual_matmul(self) -> int:
        """One block's dense projections whose outputs go straight into the residual stream (attention's output,
        the MLP's down projection): backward reads their inputs, never their outputs."""
        return sum(lin.fan_in * lin.fan_out for lin in self.counts.linears
                   if lin.kind == "linear" and lin.name in RESIDUAL_PROJECTIONS)

    @property
    def mlp_matmul(self) -> int:
        """One dense block's MLP weights a token multiplies by: gated (gate, up, down) or two layers (GPT-2)."""
        return (3 if self.family == "llama" else 2) * self.spec.hidden_size * self.mlp_width

    @property
    def mlp_width(self) -> int:
        """The MLP's width one token goes through: the dense intermediate size, or k experts' widths."""
        if self.experts:
            return self.experts.active * self.experts.width
        s = self.spec.shape
        return int(s.get("intermediate_size") or s.get("n_inner") or 4 * self.spec.hidden_size)

    @property
    def trainable(self) -> int:
        return self.counts.total if self.full else self.lora_params

    @property
    def trainable_tensors(self) -> int:
        """Trained parameter tensors: every one, or each adapter's A and B."""
        return self.counts.tensors if self.full else sum(2 * self.blocks_with(t) for t in self.targets)

    @property
    def fp32(self) -> bool:
        return self.cfg.precision == "fp32"

    @property
    def pure(self) -> bool:
        """bf16-pure: what trains is stored in bf16 (no fp32 master copy)."""
        return self.cfg.precision == "bf16-pure"

    @property
    def param_bytes(self) -> int:
        """Bytes per element of what trains (weights or adapters) and of its gradients."""
        return 2 if self.pure else 4

    @property
    def reduce_bytes(self) -> int:
        """Bytes per element FSDP2 reduce-scatters: fp32, or bf16 under bf16-pure (strategies.fsdp)."""
        return self.param_bytes

    @property
    def deepspeed(self) -> bool:
        return self.strategy.deepspeed

    @property
    def collectives(self) -> str:
        """The pattern of the strategy's collectives and buffers (strategies.PlannerFacts)."""
        return self.strategy.planner.collectives

    @property
    def whole_modules(self) -> bool:
        """Each GPU holds the model as built, its own module's parameters (no sharding, no DeepSpeed casts)."""
        return self.strategy.shards == "nothing" and not self.deepspeed

    @property
    def offloaded(self) -> bool:
        """The optimizer steps on the host (DeepSpeed's offload): masters and Adam's state leave the GPU."""
        return self.deepspeed and self.cfg.offload == "optimizer"

    @property
    def activations_offloaded(self) -> bool:
        """What the forward saves for backward waits in host memory (engine.offload)."""
        return self.cfg.offload == "activations"

    @property
    def autocast(self) -> bool:
        """The step runs under autocast (DeepSpeed casts the model itself; fp32 and bf16-pure need no cast)."""
        return not self.fp32 and not self.deepspeed and not self.pure

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of matmul outputs and low-precision weights."""
        return 4 if self.fp32 else 2

    @property
    def residual_bytes(self) -> int:
        """Bytes per element of the residual stream: the dtype the embeddings and block outputs have."""
        if self.fp32 or (self.full and not self.pure and self.whole_modules):
            return 4
        return 2

    @property
    def sharded(self) -> int:
        """How many GPUs share the model states (1 for replicated strategies)."""
        return self.shard_group if self.strategy.shards != "nothing" else 1

    @property
    def shard_group(self) -> int:
        """GPUs that shard one copy of the model states between them: all of them, or shard_size under HSDP."""
        return self.cfg.shard_size or self.world

    def gathered(self, params: float, linears: float) -> float:
        """Bytes of `params` weights (of which `linears` are block linears) as a sharding strategy gathers them for
        compute: QLoRA's block linears packed, 4 bits each, the rest in the compute dtype."""
        if self.cfg.method == "qlora":
            return linears / 2 + self.compute_bytes * (params - linears)
        return self.compute_bytes * params

    @property
    def gathered_bytes(self) -> float:
        """The whole model, as gathered for compute."""
        return self.gathered(self.counts.total, self.counts.block_linears)

    @property
    def weights_sharded(self) -> int:
        """How many GPUs share the weights themselves (ZeRO-2 shards only gradients and optimizer state)."""
        return self.shard_group if self.strategy.shards == "everything" else 1

    @property
    def fused_head(self) -> bool:
        """The head's matmul is fused with the loss (engine.loss); else chunks recomputed in backward."""
        return self.strategy.fused_head and (self.full or "lm_head" not in self.cfg.lora_targets)

    @property
    def head_trains(self) -> bool:
        return self.full

    @property
    def dropout(self) -> float:
        """The attention's dropout probability the run applies: the config's, else the model's own (GPT-2's 0.1)."""
        if self.cfg.dropout is not None:
            return self.cfg.dropout
        return float(self.spec.shape.get("attn_pdrop", 0.1) if self.family == "gpt2"
                     else self.spec.shape.get("attention_dropout", 0.0))


RESIDUAL_PROJECTIONS = ("o_proj", "down_proj", "c_proj")  # Llama-style and GPT-2 names (both of GPT-2's c_proj)


def _kind(family: Family) -> BlockKind:
    return "gpt2" if family.kind == "gpt2" else "llama"


def lora_targets(c: Counts, targets: list[str], quantized: bool = False) -> tuple[tuple[Linear, ...], tuple[int, ...]]:
    """One block's layers that get adapters, and each one's rank factor, as methods.lora asks peft for them:
    all-linear is every linear layer, and on a mixture of experts the routers and (unless 4-bit: `quantized`) the
    experts, the fused gate_up_proj at twice the rank; `experts` names both expert weights."""
    modules, params = split_targets(targets)
    chosen: list[tuple[Linear, int]] = []
    for lin in c.linears:
        if lin.kind == "experts":
            if modules == "all-linear" and not quantized:  # peft's all-linear adapts them (whatever else is named)
                chosen.append((lin, 2 if lin.name.endswith("gate_up_proj") else 1))
            elif any(lin.name == p or lin.name.endswith("." + p.split(".")[-1]) and p.startswith("experts")
                     for p in params):
                chosen.append((lin, 1))
        elif modules == "all-linear" or any(lin.name == t or t.endswith("." + lin.name) for t in modules):
            chosen.append((lin, 1))
    return tuple(lin for lin, _ in chosen), tuple(f for _, f in chosen)


def _check_targets(c: Counts, targets: list[str]) -> None:
    """Refuse a module target no linear layer answers to, as a run does (methods.lora), rather than plan it
    without its adapters."""
    modules, _ = split_targets(targets)
    if modules == "all-linear":
        return
    names = {lin.name for lin in c.linears if lin.kind != "experts"} | {"lm_head"}  # experts: 3-D weights, no layer
    for t in modules:
        if not any(t == n or t.endswith("." + n) for n in names):
            raise UserError(f"invalid lora_targets={t}: no linear layer has this name; linear layers are: "
                            f"{', '.join(sorted(names))} (or all-linear{', experts' if c.experts else ''})")


def workload(cfg: RunConfig, world: int, evaluates: bool = False) -> Workload:
    """The workload of `cfg` on `world` GPUs (`evaluates`: a train job's evaluations between steps). Refuses models
    whose architecture the planner does not know."""
    spec = resolve_model(cfg.model)
    family, c = family_of(spec.shape), counts(spec)
    if family is None or c is None:
        raise UserError(f"cannot plan model={cfg.model}: the planner knows {known()} architectures, not "
                        f"{spec.shape.get('model_type', 'this one')}")
    strategy = STRATEGIES[cfg.strategy]
    strategy.check(cfg, world, packages=False)
    if why := family_refusal(spec.shape, cfg.method, cfg.strategy):
        raise UserError(f"invalid {why[0]}={why[1]}: {why[2]}")
    cfg = resolve(cfg, strategy, "cuda", c.per_block)
    if cfg.method != "full":
        _check_targets(c, cfg.lora_targets)
    targets, factors = ((), ()) if cfg.method == "full" else lora_targets(c, cfg.lora_targets, cfg.method == "qlora")
    return Workload(cfg, spec, c, strategy, world, _kind(family), targets, evaluates, family,
                    experts_of(spec.shape, spec.num_layers), tuple(f * cfg.lora_rank for f in factors))
