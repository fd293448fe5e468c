"""Step time of one configuration: the GPU's work against its ceilings, the host's, and the network's.

  matmuls      FLOPs of every GEMM (blocks, head, adapters; recompute under checkpointing, but for the residual
               projections where it is traced) at the matmul ceiling, scaled down for narrow models and short
               micro-batches; rank-r adapters' GEMMs memory-bound; an unpadded head over an odd
               vocabulary runs cuBLAS's slow unaligned kernels; float8 GEMMs at their effective speedup, casts
               included; a mixture of experts' grouped GEMMs at the efficiency of a GEMM of each expert's rows
  attention    causal flash attention, forward + backward (2.5x the forward's FLOPs), at a share of the dense peak
               that grows with the sequence up to the kernel's own ceiling (less for heads narrower than 128 and for
               soft-capped logits)
  elementwise  memory-bound kernels: bytes moved per byte an op keeps for backward (per architecture, eager or
               compiled; more for a mixture of experts' routing), the loss's logits, QLoRA's dequantization, a full
               fine-tune's casts under autocast
  optimizer    bytes moved per trained parameter by the step (clipping included); offload=optimizer: DeepSpeed's
               CPU Adam on the host's cores shared by the node's GPUs, and the copies over PCIe, after backward
  host         Python per block and micro-batch (each compiled block's call, the hooks of sharded strategies,
               peft's calls when not compiled; the whole model as one graph: its wrapper's kernel launches): the
               step takes the longer of the GPU's work and the host's, and a little of the shorter (launch gaps);
               a strategy's own cost per optimizer step of a full fine-tune (DeepSpeed ZeRO-2's), the GPU idle
  network      the strategy's collectives at the measured bus bandwidth, the part not hidden behind compute,
               and the latency of the per-block collectives of sharded strategies
Every fitted constant is a row of plan.calibration (CAL), or of the strategy's own row (strategies.PlannerFacts);
they scale with the GPU's measured or catalog figures, and the host's with the host's kernel-launch time (hw.host;
plan.hardware).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tunebench.plan.activations import activations
from tunebench.plan.calibration import CAL
from tunebench.plan.hardware import Hardware
from tunebench.plan.workload import Workload


@dataclass(frozen=True)
class StepTime:
    seconds: float
    parts: dict[str, float]  # GPU work by kind, host, exposed communication (seconds per step)
    bound: str  # "GPU", "host" or "network"


def _width_share(hidden: int) -> float:
    """Fraction of the matmul ceiling GEMMs of this width reach with rows enough: narrow layers fall below it."""
    return max(CAL.gemm_floor_share, CAL.gemm_peak_share / (1 + (CAL.narrow_hidden / hidden) ** 5))


def matmul_efficiency(hidden: int, tokens: int) -> float:
    """Fraction of the matmul ceiling the model's GEMMs reach: narrow layers and short micro-batches fall below it."""
    return _width_share(hidden) * tokens / (tokens + CAL.matmul_half_tokens)


def head_padded(w: Workload) -> bool:
    """The head's rows padded to aligned GEMMs: in the fused loss (engine.loss), not in the model's own head."""
    return w.fused_head


def _gpu_work(w: Workload, hw: Hardware) -> dict[str, float]:
    s, c, cfg = w.spec, w.counts, w.cfg
    tokens = w.tokens * cfg.grad_accum
    share, again = w.checkpointed_share, w.recomputed_share  # blocks recomputed; those whose matmuls rerun
    traced = w.traced_share  # recomputed whole inside backward's compiled graph
    # passes over the weights: forward, backward, recompute (4-bit weights dequantized again; once for both where
    # the recompute is in backward's graph)
    passes = 2 + share - traced
    dense = c.block_matmul - c.active_experts  # what every token multiplies by at the dense GEMMs' efficiency
    # a recompute traced in backward's graph reruns only what backward reads: not the projections whose outputs go
    # straight into the residual stream
    blocks = dense * (6 if w.full else 4) + 2 * (dense * again - w.residual_matmul * w.layers * traced)
    if w.chunked_mlp:  # backward runs each chunk's forward again (engine.chunked_mlp)
        blocks += 2 * w.mlp_matmul * w.layers
    # experts: their weight gradients where they train (full fine-tuning; LoRA's expert adapters are adapters)
    experts = c.active_experts * (6 if w.full else 4) + 2 * c.active_experts * again
    head = c.head * (6 if w.head_trains else 4) + (0 if w.fused_head else 2 * c.head)
    kept = w.kept_share  # blocks keeping attention and the adapters' first factor: only the up-projections rerun
    adapters = w.active_lora_params * (6 + kept + 2 * (share - kept))
    ceiling, adapter_ceiling = _ceilings(w, hw)
    # float8: the blocks' GEMMs (not the head's) at float8's effective speedup, its casts included
    speedup = CAL.float8_frozen_speedup if cfg.frozen_float8 else CAL.float8_gemm_speedup[cfg.float8]
    odd = CAL.unaligned_head_slowdown if s.vocab_size % CAL.head_align and not head_padded(w) else 1.0
    gemm = (blocks / speedup + head * odd) * tokens / ceiling
    gemm += adapters * tokens / adapter_ceiling  # rank-r GEMMs are far from the tensor cores' ceiling
    gemm += _experts_gemm(w, experts, ceiling)
    q = s.num_heads * s.head_dim
    attention = 2 * cfg.seq_len * q * w.layers * (3.5 + share - kept) * tokens
    if w.dropout:
        attention *= CAL.fp32_attention_dropout_slowdown if w.fp32 else CAL.attention_dropout_slowdown
    act = activations(w)
    per_saved = (CAL.fp32_elementwise_bytes if w.fp32 else CAL.elementwise_bytes)[w.family, cfg.compile]
    block_moved = per_saved * (act.per_layer + act.float8_fewer)  # float8's casts read what bf16's kept
    moved = _blocks_bytes(w, block_moved, tokens)
    moved += CAL.loss_bytes_per_logit * w.compute_bytes / 2 * tokens * s.vocab_size  # fitted on 16-bit logits
    if cfg.method == "qlora":
        moved += 2.5 * c.block_linears * passes * cfg.grad_accum  # 4-bit read, bf16 written, per pass
    # bf16-pure: AdamW's parameters, gradients and states are half as many bytes (not measured yet: scaled)
    half = w.pure and cfg.optimizer in ("adamw", "adamw_fused")
    per_param = w.strategy.planner.optimizer_bytes.get(cfg.optimizer, CAL.optimizer_bytes[cfg.optimizer])
    optimizer = per_param * (0.5 if half else 1.0) * w.trainable / w.sharded / hw.bandwidth
    if w.offloaded:  # on the host: the node's cores shared by its GPUs' processes, and the copies over PCIe
        local = w.trainable / w.sharded
        per_node = w.world // max(1, cfg.nnodes)
        optimizer = local * (CAL.host_adam_s_per_param * per_node + CAL.offload_bytes_per_param / CAL.pcie_bytes_per_s)
    if w.fp32:
        attention_flops = CAL.fp32_attention_of_peak * cfg.seq_len / (cfg.seq_len + CAL.fp32_attention_half_seq) \
            * hw.gpu.fp32_peak_flops
    else:
        attention_flops = _attention_share(w) * hw.gpu.peak_flops
    work = {"matmul": gemm, "attention": attention / attention_flops, "elementwise": moved / hw.bandwidth,
            "optimizer": optimizer}
    if w.reference_forward:
        work["reference forward"] = _reference_forward(w, hw, (ceiling, adapter_ceiling), attention_flops,
                                                       block_moved)
    return work


def _blocks_bytes(w: Workload, bytes_per_token_layer: float, tokens: int) -> float:
    """Bytes the blocks' memory-bound kernels move in a step (forward, backward, recompute)."""
    share = w.checkpointed_share
    # backward moves about twice the forward's bytes; a recompute adds one forward (traced in the compiled block's
    # backward graph, the part of it fused with backward's own kernels saved)
    traffic = 2 * (1 + (share - w.traced_share * CAL.traced_recompute_fused) / 3)
    moved = bytes_per_token_layer * w.layers * traffic * tokens
    if w.experts:  # routing's gathers, scatters and sorts: memory-bound kernels that compile does not fuse away
        moved *= CAL.experts_elementwise_share
    if w.full and w.autocast:  # fp32 weights cast for every forward (a recompute's too), bf16 gradients added to fp32
        casts = CAL.autocast_cast_bytes_per_param * (1 + share) + CAL.autocast_grad_bytes_per_param
        moved += casts * w.trainable / w.sharded * w.cfg.grad_accum
    return moved


def _attention_share(w: Workload) -> float:
    """Share of the dense peak causal attention reaches, forward + backward: the kernel's curve over the sequence
    up to its ceiling; heads narrower than 128 fill its tiles less; soft-capped logits (Gemma 2) leave SDPA's fused
    kernels for FlexAttention's."""
    seq = w.cfg.seq_len
    share = min(CAL.attention_of_peak * seq / (seq + CAL.attention_half_seq), CAL.attention_kernel_of_peak)
    if w.spec.head_dim < 128:
        share *= CAL.narrow_head_attention_share
    if w.arch is not None and w.arch.softcap:
        share /= CAL.softcap_attention_slowdown
    return share


def _reference_forward(w: Workload, hw: Hardware, ceilings: tuple[float, float], attention_flops: float,
                       bytes_per_token_layer: float) -> float:
    """DPO's reference pass: one forward over the micro-batches' tokens (the base's GEMMs, the head's logits,
    attention, the elementwise ops' forward share, QLoRA's weights dequantized once more; through the policy's
    compiled graph, the adapters' forward products too)."""
    s, c, cfg = w.spec, w.counts, w.cfg
    tokens = w.tokens * cfg.grad_accum
    ceiling, adapter_ceiling = ceilings
    gemm = 2 * (c.block_matmul + c.head) * tokens / ceiling
    if w.reference_runs_adapters:
        gemm += 2 * w.active_lora_params * tokens / adapter_ceiling
    attention = 2 * cfg.seq_len * s.num_heads * s.head_dim * w.layers * tokens / attention_flops
    moved = bytes_per_token_layer * w.layers * tokens * 2 / 3  # a forward: a third of forward + backward's traffic
    moved += CAL.loss_bytes_per_logit * w.compute_bytes / 4 * tokens * s.vocab_size
    if cfg.method == "qlora":
        moved += 2.5 * c.block_linears * cfg.grad_accum
    return gemm + attention + moved / hw.bandwidth


def _ceilings(w: Workload, hw: Hardware) -> tuple[float, float]:
    """FLOP/s the model's GEMMs reach, and the rank-r adapters' (far from the tensor cores' ceiling)."""
    hidden = w.spec.hidden_size
    if w.fp32 and w.cfg.tf32 and hw.gpu.tf32:  # on the tensor cores, as bf16's GEMMs are
        ceiling = hw.tf32_matmul_flops * matmul_efficiency(hidden, w.tokens) * CAL.tf32_of_bf16_efficiency
        return ceiling, hw.tf32_matmul_flops * CAL.adapter_matmul_share
    if w.fp32:
        work = w.tokens * hidden
        ceiling = hw.fp32_matmul_flops * work / (work + CAL.fp32_matmul_half_work)
        return ceiling, ceiling
    return hw.matmul_flops * matmul_efficiency(hidden, w.tokens), hw.matmul_flops * CAL.adapter_matmul_share


def _experts_gemm(w: Workload, flops_per_token: float, ceiling: float) -> float:
    """Seconds of a mixture of experts' grouped GEMMs, each expert over its share of the micro-batch's tokens; LoRA
    on the experts adds rank-r grouped GEMMs (methods.expert_adapters: two a forward, four a backward per adapted
    weight), whose time at these ranks is each group's fixed cost rather than their few FLOPs (counted with the
    adapters' FLOPs)."""
    if not w.experts:
        return 0.0
    s, cfg = w.spec, w.cfg
    # one grouped GEMM over every (token, expert) pair: each expert's group is a GEMM of its share of the rows, and
    # reaches the ceiling as a GEMM of so few rows does, far below the share of a dense GEMM over every token
    rows = w.tokens * w.experts.active / w.experts.count
    share = _width_share(s.hidden_size) * rows / (rows + CAL.grouped_half_rows)
    grouped = ceiling / matmul_efficiency(s.hidden_size, w.tokens) * share
    seconds = flops_per_token * w.tokens * cfg.grad_accum / grouped
    adapted = sum(1 for t in w.targets if t.kind == "experts")
    calls = adapted * w.experts.sparse * (6 + 2 * w.checkpointed_share) * cfg.grad_accum
    return seconds + calls * w.experts.count * CAL.grouped_gemm_per_group_s


def _host(w: Workload) -> float:
    facts = w.strategy.planner
    if w.cuda_graphs:
        return w.cfg.grad_accum * w.layers * CAL.cuda_graph_host_per_block_s
    if w.whole_graph:
        return w.cfg.grad_accum * w.layers * (CAL.whole_graph_host_per_block_s + facts.whole_graph_host_per_block_s)
    # a block keeping its matmuls, or recomputed in its compiled backward's graph, makes no extra calls; DPO's
    # reference adds a forward
    passes = 2 + w.recomputed_share - w.traced_share + w.reference_forward
    # compiled blocks trace peft's per-adapter Python into their graph: no host calls per adapter left
    eager = 0.0 if w.cfg.compile is True else CAL.host_per_adapter_s
    compiled_apart = w.cfg.compile is True and facts.compiled_blocks_host
    per_block = CAL.host_per_compiled_block_s if compiled_apart else facts.host_per_block_s
    per_block += len(w.targets) * (eager + facts.host_per_adapter_s) * passes
    # a hook per trained tensor in backward (DeepSpeed copies each gradient into its bucket from Python)
    return w.cfg.grad_accum * (w.layers * per_block + w.trainable_tensors * facts.host_per_tensor_s)


def _network(w: Workload, hw: Hardware, compute: float) -> float:
    """Seconds of communication per step that compute does not hide."""
    facts = w.strategy.planner
    if w.world == 1 or facts.collectives == "none":
        return 0.0
    inside, across = COLLECTIVES[facts.collectives](w, hw)
    latency = w.cfg.grad_accum * w.layers * facts.collective_latency_per_block_s
    in_node = facts.overlap if facts.overlap_in_node is None else facts.overlap_in_node
    exposed = max(inside - in_node * compute, 0.0) + max(across - facts.overlap * compute, 0.0)
    if w.cfg.nnodes > 1:  # never less than the same collectives cost within one node
        one_node = replace(w, cfg=w.cfg.model_copy(update={"nnodes": 1}))
        exposed = max(exposed, max(sum(COLLECTIVES[facts.collectives](one_node, hw)) - in_node * compute, 0.0))
    return exposed + latency + _after_step(w, hw)


def _split(t: float, nodes: int) -> tuple[float, float]:
    """(seconds within a node, seconds across nodes) of collectives over `nodes` nodes."""
    return (t, 0.0) if nodes <= 1 else (0.0, t)


def _all_reduce(w: Workload, hw: Hardware) -> tuple[float, float]:
    """The gradients all-reduced, fp32 (bf16-pure: bf16); a ring moves 2(W-1)/W of the bytes."""
    share = (w.world - 1) / w.world
    return _split(2 * share * w.param_bytes * w.trainable / hw.collective("all_reduce", w.cfg.nnodes), w.cfg.nnodes)


def _fsdp(w: Workload, hw: Hardware) -> tuple[float, float]:
    """bf16 all-gathers in forward and backward, a reduce-scatter (fp32; bf16-pure: bf16), per micro-batch; HSDP:
    within groups of shard_size GPUs, then the shards all-reduced across them."""
    n, world, nodes, group = w.trainable, w.world, w.cfg.nnodes, w.shard_group
    spans = -(-group // (world // nodes))  # nodes one shard group spans
    inside = (group - 1) / group
    gathers = 2 + w.reference_forward  # forward, backward, and DPO's reference forward (its copy, or the base)
    t = w.cfg.grad_accum * inside * gathers * w.gathered_bytes / hw.collective("all_gather", spans)
    t += inside * w.reduce_bytes * n / hw.collective("reduce_scatter", spans)
    in_node, across = _split(t, spans)
    if group < world:
        replicas = world // group
        replicated = 2 * (replicas - 1) / replicas * w.reduce_bytes * n / group / hw.collective("all_reduce", nodes)
        more_in_node, more_across = _split(replicated, nodes)
        in_node, across = in_node + more_in_node, across + more_across
    return in_node, across


def _zero2(w: Workload, hw: Hardware) -> tuple[float, float]:
    """bf16 reduce-scatter of the gradients, beside backward."""
    share, n, nodes = (w.world - 1) / w.world, w.trainable, w.cfg.nnodes
    return _split(share * 2 * n / hw.collective("reduce_scatter", nodes), nodes)


def _after_step(w: Workload, hw: Hardware) -> float:
    """ZeRO-2's all-gather of the updated bf16 weights, after the optimizer's step: no compute left to hide it."""
    if w.strategy.planner.collectives != "zero2":  # (_network answers 0 for one GPU before asking)
        return 0.0
    share, nodes = (w.world - 1) / w.world, w.cfg.nnodes
    return share * 2 * w.trainable / hw.collective("all_gather", nodes)


def _zero3(w: Workload, hw: Hardware) -> tuple[float, float]:
    """Weights gathered for forward and backward, per micro-batch; gradients reduce-scattered."""
    share, nodes = (w.world - 1) / w.world, w.cfg.nnodes
    t = w.cfg.grad_accum * share * 2 * w.gathered_bytes / hw.collective("all_gather", nodes)
    return _split(t + share * 2 * w.trainable / hw.collective("reduce_scatter", nodes), nodes)


# strategies.PlannerFacts.collectives -> seconds of the step's collectives within nodes and across them (before
# overlap)
COLLECTIVES = {"all_reduce": _all_reduce, "fsdp": _fsdp, "zero2": _zero2, "zero3": _zero3}


def step_time(w: Workload, hw: Hardware) -> StepTime:
    gpu = _gpu_work(w, hw)
    compute, host = sum(gpu.values()), _host(w) * hw.host_scale
    network = _network(w, hw, compute)
    # host-bound: the GPU idles between launches; GPU-bound: part of the host's work still shows
    gaps = w.strategy.planner.launch_gaps
    if gaps is None:
        gaps = CAL.launch_gaps_compiled if w.cfg.compile is True else CAL.launch_gaps
    busy = host if host > compute else compute + gaps * host
    busy += CAL.deepspeed_per_micro_s * w.cfg.grad_accum if w.deepspeed else 0.0
    busy += w.strategy.planner.full_step_s * hw.host_scale if w.full else 0.0  # after backward, the GPU idle
    parts = gpu | {"host": host, "network (exposed)": network}
    offloaded = gpu["optimizer"] if w.offloaded else 0.0  # the host's CPU Adam and PCIe copies, in the step
    host_side, gpu_side = host + offloaded, compute - offloaded
    bound = "network" if network > 0.25 * busy else ("host" if host_side > gpu_side else "GPU")
    copies = _activation_copies(w)  # offload=activations: each way on its own stream, beside the compute
    if copies:
        exposed = max(copies - compute, CAL.copies_exposed * copies)
        parts["activation copies (exposed)"] = exposed
        busy += exposed
        bound = "host link" if copies > compute else bound
    return StepTime(busy + network, parts, bound)


def _activation_copies(w: Workload) -> float:
    """Seconds of one direction's copies of the saved activations (offload=activations), per step."""
    if not w.activations_offloaded:
        return 0.0
    return activations(w).saved_by_blocks(w) * w.cfg.grad_accum / CAL.activation_copy_bytes_per_s
