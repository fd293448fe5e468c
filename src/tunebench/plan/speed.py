"""Step time of one configuration: the GPU's work against its ceilings, the host's, and the network's.

  matmuls      FLOPs of every GEMM (blocks, head, adapters; recompute under checkpointing) at the matmul
               ceiling, scaled down for narrow models and short micro-batches (measured: 90% of MAMF at
               hidden 768, 93% at 2048; 20% less again with 2048 tokens than with 16384), an unpadded head
               over an odd vocabulary 8x slower
               (float8: the blocks' GEMMs 1.45x faster tensorwise, 1.3x rowwise, casts included; a frozen base's
               1.43x; measured)
  attention    causal flash attention, forward + backward (2.5x), at a share of the dense peak that grows with
               the sequence (10% at 512 tokens, 32% at 2048, 48% at 4096; profiled)
  elementwise  memory-bound kernels: 8.6-8.8 bytes moved per byte an op keeps for backward, 3.0 (GPT-2) and 5.1
               (Llama) compiled (fitted per architecture on the records, GPT-2's as its kernels profile), the
               loss's fp32 logits, QLoRA's dequantization
  optimizer    bytes moved per trained parameter (fused AdamW with clipping, profiled: 45 unsharded, 95 FSDP2);
               offload=optimizer: DeepSpeed's CPU Adam on the host's cores shared by the node's GPUs, and the
               gradients' and weights' copies over PCIe, after backward
  host         Python per block and micro-batch (each compiled block's call, hooks of FSDP2 and ZeRO-3, peft's
               calls when not compiled; the whole model compiled as one graph: its wrapper's kernel launches):
               the step takes the longer of the GPU's work and the host's, and a little of the shorter
               (launch gaps)
  network      the strategy's collectives at the measured bus bandwidth, the part not hidden behind compute,
               and the latency of the per-block collectives of sharded strategies
Constants were measured on an H200 host (benchmarks/data); elsewhere they scale with the GPU's figures, and the
host's with the host's kernel-launch time (hw.host; plan.hardware).
"""

from __future__ import annotations

from dataclasses import dataclass

from tunebench.plan.activations import activations
from tunebench.plan.hardware import Hardware
from tunebench.plan.workload import Workload

# Causal attention's share of the dense peak grows with the sequence; cuDNN's and flash's kernels, profiled on Hopper:
# 11% at s512 (Mistral-7B, 8.5 ms a step), 31-36% at s2048 (Llama-3.2-1B; GPT-2 small without dropout), 43% at
# s4096 (Llama-3-8B). ATTENTION_OF_PEAK * s / (s + ATTENTION_HALF_SEQ) gives 10%, 32% and 48%.
ATTENTION_OF_PEAK = 0.95
ATTENTION_HALF_SEQ = 4096
# Narrow models' GEMMs reach 0.93 / (1 + (NARROW_HIDDEN / hidden)^5) of the ceiling: 90% at GPT-2's 768 (profiled
# on an H200 with the padded head: its blocks' and head's GEMMs 16.7-17.2 ms a step, 12.2 TFLOP at ~0.9 of 807
# TFLOP/s), 93% from 2048 up
NARROW_HIDDEN = 400
# fp32 (TF32 off, PyTorch's default), profiled on an H100 (fp32 MAMF 51.1 TFLOP/s): GEMMs on the CUDA cores reach
# the fp32 MAMF but for small ones, as tokens x hidden / (that + FP32_MATMUL_HALF_WORK) (GPT-2 small at 4,096 tokens
# 93%, at 16,384 100%; Llama-3.2-1B at 4,096 100%). Attention in SDPA's memory-efficient kernel (the one fp32
# takes), a share of the fp32 peak that grows with the sequence: FP32_ATTENTION_OF_PEAK * s / (s +
# FP32_ATTENTION_HALF_SEQ) (Llama-3.2-1B 44% at 2,048), its dropout drawn in the kernel slower by
# FP32_ATTENTION_DROPOUT_SLOWDOWN (GPT-2 small with dropout: 27%, 30%, 39% at 512, 1,024 and 2,048 tokens; its step
# at 2,048 16 ms shorter without; fitted at 1,024 and 2,048, 512's attention 30% slow)
FP32_MATMUL_HALF_WORK = 2.4e5
FP32_ATTENTION_OF_PEAK = 0.64
FP32_ATTENTION_HALF_SEQ = 880
FP32_ATTENTION_DROPOUT_SLOWDOWN = 1.15
# fp32 with tf32: the GEMMs on the tensor cores reach this share of bf16's curve (matmul_efficiency) of the TF32 MAMF
# (404 TFLOP/s on an H100), profiled: Llama-3.2-1B at 4,096 tokens 0.94 (98.7 ms of GEMMs a step), GPT-2 small 0.79
# (12.2 ms)
TF32_OF_BF16_EFFICIENCY = 0.85
# Short micro-batches fall below the ceiling as tokens / (tokens + MATMUL_HALF_TOKENS). Profiled GEMMs at 4,096-8,192
# tokens lost less (GPT-2 medium 96% of the ceiling); the records want 600, which carries other short-step costs
MATMUL_HALF_TOKENS = 600
# A head whose rows are not a multiple of HEAD_ALIGN (GPT-2's 50,257): cuBLAS takes slow 1-element-aligned kernels,
# this many times slower. The fused loss pads its head (engine.loss); a head computed by the model is not. Fitted
# with NARROW_HIDDEN on the GPT-2 runs made before the loss padded it: all 32 within 15% (a knee of 880 had folded
# the slow head into every narrow model's GEMMs)
HEAD_ALIGN = 64
UNALIGNED_HEAD_SLOWDOWN = 8.0
# SDPA with dropout draws its mask inside the kernel: GPT-2 small s2048 on an H200, 10.0 ms of attention a step
# with 0.1 against 6.1 without (whole-model compile, one job); ATTENTION_OF_PEAK is set from runs without it
ATTENTION_DROPOUT_SLOWDOWN = 1.6
# float8 (torchao) block GEMMs against bf16, casts to float8 included, compiled: fitted on Llama-3-8B full FSDP2 on
# 2 and 4 H200s (tensorwise: 4 runs, within 5%; rowwise: 1 run); float8's tensor-core peak is 2x bf16's
FLOAT8_GEMM_SPEEDUP = {"off": 1.0, "tensorwise": 1.45, "rowwise": 1.3}
# a frozen LoRA/QLoRA base in float8 (models.float8_frozen): its two products a layer, casts included, on Mistral-7B's
# shapes at 4,096 tokens (benchmarks/kernels_vs.py --ops base_fp8 on an H200: 3.60 against 5.13 ms)
FLOAT8_FROZEN_SPEEDUP = 1.43
# (compiled and Llama's refitted on every GPU record once attention, the optimizer and the loss were set from
# profiles, 2026-11-23; GPT-2's compiled one again once GPT-2's dropout slowed its attention rather than its absence
# sped it up, 2026-11-24: 3.0; its whole graph's fused kernels profiled on an H100 imply 2.7-4.1)
ELEMENTWISE_BYTES_PER_SAVED = {("gpt2", False): 8.6, ("gpt2", True): 3.0, ("llama", False): 8.8,
                               ("llama", True): 5.1}  # (architecture, compiled)
# ... in fp32, whose saved bytes are all 4-byte tensors: profiled on an H100 (GPT-2 small eager at 4,096 tokens and
# compiled at 4,096 and 16,384; Llama-3.2-1B compiled at 4,096), Llama eager from its step less the rest
FP32_ELEMENTWISE_BYTES_PER_SAVED = {("gpt2", False): 3.7, ("gpt2", True): 2.2, ("llama", False): 6.3,
                                    ("llama", True): 2.35}
# the fused loss's compiled softmax over a chunk's logits (engine.loss), per logit: profiled on an H100, GPT-2 small
# s2048 b8 (824M padded logits, 2.46 ms) and Llama-3.2-1B s2048 b2 (525M, 1.47 ms), 9 bytes at the copy bandwidth
# (30 with the eager softmax before it was compiled)
LOSS_BYTES_PER_LOGIT = 9
# bytes moved per trainable parameter by the optimizer's step (clipping included); fused AdamW's one kernel fitted on
# Llama-3.2-1B full on one H200, 8% faster a step than foreach's in the same job (benchmarks/RESULTS.md)
OPTIMIZER_BYTES = {"adamw": 118, "adamw_fused": 77, "adamw_8bit": 50, "paged_adamw_8bit": 50}
# Torch's AdamW by strategy, its kernels profiled (foreach keeps the 41 bytes more than fused it was fitted with):
# unsharded (single, DDP) on an H100, 18.4 ms a step for Llama-3.2-1B's 1.24B parameters and 1.9 ms for GPT-2
# small's 124M, clipping included: 45 bytes each; FSDP2's DTensor shards on 4 H200s, Llama-3-8B: 45 ms a step for
# 2.0B parameters a GPU, 95 bytes. DeepSpeed's keep OPTIMIZER_BYTES.
_UNSHARDED = OPTIMIZER_BYTES | {"adamw": 86, "adamw_fused": 45}
OPTIMIZER_BYTES_BY_STRATEGY = {"single": _UNSHARDED, "ddp": _UNSHARDED,
                               "fsdp": OPTIMIZER_BYTES | {"adamw": 136, "adamw_fused": 95}}
# Host seconds per block per micro-batch, and per adapted linear per pass (measured on the H200 host)
HOST_PER_BLOCK = {"single": 0.8e-3, "ddp": 0.8e-3, "fsdp": 2.7e-3, "zero2": 0.8e-3, "zero3": 6.2e-3}
HOST_PER_ADAPTER = 0.5e-3
# ZeRO-3 with adapters: its fetch and release hooks on each LoRA-wrapped linear's modules, per pass (fitted on
# Llama-3-8B QLoRA on 2 H200s and Llama-3-70B LoRA on 4: both ~72 ms per block per micro-batch, host-bound)
HOST_PER_ADAPTER_ZERO3 = 2.6e-3
DEEPSPEED_PER_MICRO_S = 8e-3  # DeepSpeed's engine bookkeeping per micro-batch (backward hooks, step calls)
# Blocks compiled apart (single, DDP, ZeRO-2): each block's compiled call, its guards and its kernels' launches, per
# block and micro-batch. Short micro-batches of GPT-2 small are host-bound so (s512 b16: GPU 65% busy on an H200,
# 60% on an H100); fitted on every GPU record with the constants below (benchmarks/RESULTS.md, 2026-11-23 eighth).
HOST_PER_COMPILED_BLOCK = 2.5e-3
# The whole model compiled as one graph (compile_scope model): one call per micro-batch, no Python between blocks,
# but the graph's wrapper still launches each kernel from the host: per block and micro-batch (GPT-2 small at 2,048
# and 4,096 tokens on an H100: 22.9 and 19.3-21.6 ms a step, the GPU busy 13.0 ms of it at 4,096: host-bound;
# fitted on every record, 2026-11-24)
WHOLE_GRAPH_HOST_PER_BLOCK = 1.6e-3
# ... and under DDP more again, at one rank as at two (so not communication): GPT-2 small whole on an H200, 37.7 ms a
# step at 4,096 tokens under DDP with one rank against 18.4 ms without DDP; 30.6 and 35.6 ms at 2,048 and 8,192
# tokens on two ranks (GPU work about 10 and 20 ms). Dynamo cuts a DDP model's graph where its buckets end, each
# piece its own call: taken per block, fitted on the two-rank records (measured with GPT-2 small only)
DDP_WHOLE_GRAPH_HOST_PER_BLOCK = 1.2e-3
# ... unless its passes are replayed as CUDA graphs (cuda_graphs): one launch a pass; what the host still does grows
# with the blocks (the graph's outputs checked for liveness and rebuilt, autograd taking each gradient), per block
# and micro-batch
CUDA_GRAPH_HOST_PER_BLOCK = 0.6e-3
# Of the shorter of GPU and host time, what still shows (launch gaps); ZeRO-3 waits for each gathered weight.
LAUNCH_GAPS = {"zero3": 0.45}
LAUNCH_GAPS_DEFAULT = 0.1
LAUNCH_GAPS_COMPILED = 0.05
# Latency of the per-block collectives of sharded strategies, per block and micro-batch, on more than one GPU
COLLECTIVE_LATENCY_PER_BLOCK = {"fsdp": 0.5e-3, "zero3": 0.3e-3}
# offload=optimizer: host seconds per trained parameter of CPU Adam with all of a node's cores, and the
# bytes of each parameter that cross PCIe (bf16 gradient down, bf16 weight up) at the copies' bandwidth.
# Fitted on one run (Llama-3-8B full ZeRO-3 on one H200 of a 64-core host: 6.6 s steps); hosts differ widely.
HOST_ADAM_S_PER_PARAM = 0.45e-9
OFFLOAD_BYTES_PER_PARAM = 4
PCIE_BYTES_PER_S = 20e9
# offload=activations, measured on an H200 (Mistral-7B s512 b8): the saved activations' pinned copies, one
# direction, 20 GB/s as a forward keeping 12.5 GiB of matmul outputs was held to them (the host waits for the
# copies); hidden behind the compute but for 40% of their time (1 GiB each way cost 21 ms of a 370 ms step)
ACTIVATION_COPY_BYTES_PER_S = 20e9
COPIES_EXPOSED = 0.4
HIDDEN_BEHIND_COMPUTE = {"ddp": 0.8, "fsdp": 0.7, "zero2": 0.7, "zero3": 0.5}
# A mixture of experts' GEMMs are grouped (torch's grouped GEMM, one kernel over every token-expert pair) at the
# efficiency of a matmul of that many rows, times this for grouping and routing (the sort, the gather, the weighted
# sum back; fitted on Qwen3-30B-A3B's H100 runs, benchmarks/RESULTS.md)
MOE_GROUPED_EFFICIENCY = 0.6
# LoRA on an MoE's experts (peft's ParamWrapper) rebuilds every expert's weight as W + scale * B A at every pass, and
# its backward makes each expert weight's whole gradient to reach the adapters: per expert weight and pass, as bytes
# at the memory's bandwidth (fitted on one run, benchmarks/RESULTS.md; peft's einsums move several times the bytes of
# W, W' and their gradient)
EXPERT_DELTA_BYTES = 38


@dataclass(frozen=True)
class StepTime:
    seconds: float
    parts: dict[str, float]  # GPU work by kind, host, exposed communication (seconds per step)
    bound: str  # "GPU", "host" or "network"


def matmul_efficiency(hidden: int, tokens: int) -> float:
    """Fraction of the matmul ceiling the model's GEMMs reach: narrow layers and short micro-batches fall below it."""
    return max(0.05, 0.93 / (1 + (NARROW_HIDDEN / hidden) ** 5)) * tokens / (tokens + MATMUL_HALF_TOKENS)


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
    blocks = dense * (6 if w.full else 4) + 2 * dense * again
    # experts: their weight gradients where they train (full, or LoRA through peft's rebuilt weights)
    experts = c.active_experts * (6 if w.full or w.adapts_experts else 4) + 2 * c.active_experts * again
    head = c.head * (6 if w.head_trains else 4) + (0 if w.fused_head else 2 * c.head)
    kept = w.kept_share  # blocks keeping attention and the adapters' first factor: only the up-projections rerun
    adapters = w.active_lora_params * (6 + kept + 2 * (share - kept))
    if w.fp32 and cfg.tf32 and hw.gpu.tf32:  # on the tensor cores, as bf16's GEMMs are
        ceiling = hw.tf32_matmul_flops * matmul_efficiency(s.hidden_size, w.tokens) * TF32_OF_BF16_EFFICIENCY
        adapter_ceiling = hw.tf32_matmul_flops * 0.15
    elif w.fp32:
        work = w.tokens * s.hidden_size
        ceiling = adapter_ceiling = hw.fp32_matmul_flops * work / (work + FP32_MATMUL_HALF_WORK)
    else:
        ceiling, adapter_ceiling = hw.matmul_flops * matmul_efficiency(s.hidden_size, w.tokens), hw.matmul_flops * 0.15
    # float8: the blocks' GEMMs (not the head's) at float8's effective speedup, its casts included
    speedup = FLOAT8_FROZEN_SPEEDUP if cfg.frozen_float8 else FLOAT8_GEMM_SPEEDUP[cfg.float8]
    odd = UNALIGNED_HEAD_SLOWDOWN if s.vocab_size % HEAD_ALIGN and not head_padded(w) else 1.0
    gemm = (blocks / speedup + head * odd) * tokens / ceiling
    gemm += adapters * tokens / adapter_ceiling  # rank-r GEMMs are far from the tensor cores' ceiling
    gemm += _experts_gemm(w, experts, ceiling, adapter_ceiling, passes)
    q = s.num_heads * s.head_dim
    attention = 2 * cfg.seq_len * q * w.layers * (3.5 + share - kept) * tokens
    if w.dropout:
        attention *= FP32_ATTENTION_DROPOUT_SLOWDOWN if w.fp32 else ATTENTION_DROPOUT_SLOWDOWN
    act = activations(w)
    # backward moves about twice the forward's bytes; a recompute adds one forward, but for a checkpoint traced
    # in the compiled block, whose backward graph fuses the recompute's elementwise ops with its own
    traffic = 2 * (1 + (share - traced) / 3)
    per_saved = (FP32_ELEMENTWISE_BYTES_PER_SAVED if w.fp32 else ELEMENTWISE_BYTES_PER_SAVED)[w.family, cfg.compile]
    moved = per_saved * act.per_layer * w.layers * traffic * tokens
    moved += LOSS_BYTES_PER_LOGIT * w.compute_bytes / 2 * tokens * s.vocab_size  # fitted on 16-bit logits
    if cfg.method == "qlora":
        moved += 2.5 * c.block_linears * passes * cfg.grad_accum  # 4-bit read, bf16 written, per pass
    if w.adapts_experts:
        moved += EXPERT_DELTA_BYTES * c.experts * passes * cfg.grad_accum
    # bf16-pure: AdamW's parameters, gradients and states are half as many bytes (not measured yet: scaled)
    half = w.pure and cfg.optimizer in ("adamw", "adamw_fused")
    per_param = OPTIMIZER_BYTES_BY_STRATEGY.get(w.strategy.name, OPTIMIZER_BYTES)[cfg.optimizer]
    optimizer = per_param * (0.5 if half else 1.0) * w.trainable / w.sharded / hw.bandwidth
    if w.offloaded:  # on the host: the node's cores shared by its GPUs' processes, and the copies over PCIe
        local = w.trainable / w.sharded
        per_node = w.world // max(1, cfg.nnodes)
        optimizer = local * (HOST_ADAM_S_PER_PARAM * per_node + OFFLOAD_BYTES_PER_PARAM / PCIE_BYTES_PER_S)
    if w.fp32:
        attention_flops = FP32_ATTENTION_OF_PEAK * cfg.seq_len / (cfg.seq_len + FP32_ATTENTION_HALF_SEQ) \
            * hw.gpu.fp32_peak_flops
    else:
        attention_flops = ATTENTION_OF_PEAK * cfg.seq_len / (cfg.seq_len + ATTENTION_HALF_SEQ) * hw.gpu.peak_flops
    return {"matmul": gemm, "attention": attention / attention_flops,
            "elementwise": moved / hw.bandwidth, "optimizer": optimizer}


def _experts_gemm(w: Workload, flops_per_token: float, ceiling: float, adapter_ceiling: float,
                  passes: float) -> float:
    """Seconds of a mixture of experts' grouped GEMMs, each expert over its share of the micro-batch's tokens; with
    LoRA on the experts, W' = W + B A for every expert at each pass (rank-r GEMMs over the whole stack)."""
    if not w.experts:
        return 0.0
    s, cfg = w.spec, w.cfg
    rows = w.tokens * w.experts.active  # one grouped GEMM over every (token, expert) pair
    grouped = ceiling / matmul_efficiency(s.hidden_size, w.tokens) * matmul_efficiency(s.hidden_size, rows)
    seconds = flops_per_token * w.tokens * cfg.grad_accum / (grouped * MOE_GROUPED_EFFICIENCY)
    if w.adapts_experts:
        rank = max(w.target_ranks or (cfg.lora_rank,))
        seconds += 2 * rank * w.counts.experts * (1 + passes) * cfg.grad_accum / adapter_ceiling
    return seconds


def _host(w: Workload) -> float:
    if w.cuda_graphs:
        return w.cfg.grad_accum * w.layers * CUDA_GRAPH_HOST_PER_BLOCK
    if w.whole_graph:
        ddp = DDP_WHOLE_GRAPH_HOST_PER_BLOCK if w.strategy.name == "ddp" else 0.0
        return w.cfg.grad_accum * w.layers * (WHOLE_GRAPH_HOST_PER_BLOCK + ddp)
    # a block keeping its matmuls, or recomputed in its compiled backward's graph, makes no extra calls
    passes = 2 + w.recomputed_share - w.traced_share
    # compiled blocks trace peft's per-adapter Python into their graph: no host calls per adapter left
    eager = 0.0 if w.cfg.compile is True else HOST_PER_ADAPTER
    per_adapter = eager + (HOST_PER_ADAPTER_ZERO3 if w.strategy.name == "zero3" else 0.0)
    compiled_apart = w.cfg.compile is True and w.strategy.name in ("single", "ddp", "zero2")
    per_block = HOST_PER_COMPILED_BLOCK if compiled_apart else HOST_PER_BLOCK[w.strategy.name]
    per_block += len(w.targets) * per_adapter * passes
    return w.cfg.grad_accum * w.layers * per_block


def _network(w: Workload, hw: Hardware, compute: float) -> float:
    """Seconds of communication per step that compute does not hide."""
    n, world, name = w.trainable, w.world, w.strategy.name
    if world == 1 or name == "single":
        return 0.0
    share = (world - 1) / world
    nodes = w.cfg.nnodes
    if name == "ddp":  # all-reduce of the gradients, fp32 (bf16-pure: bf16) (ring: 2(W-1)/W of the bytes)
        t = 2 * share * w.param_bytes * n / hw.collective("all_reduce", nodes)
    elif name == "fsdp":  # bf16 all-gathers in forward and backward, fp32 reduce-scatter, per micro-batch
        group = w.shard_group  # HSDP: within groups of shard_size GPUs, then the shards all-reduced across them
        spans = -(-group // (world // nodes))  # nodes one shard group spans
        inside = (group - 1) / group
        t = w.cfg.grad_accum * inside * 2 * w.gathered_bytes / hw.collective("all_gather", spans)
        t += inside * 4 * n / hw.collective("reduce_scatter", spans)
        if group < world:
            replicas = world // group
            t += 2 * (replicas - 1) / replicas * 4 * n / group / hw.collective("all_reduce", nodes)
    elif name == "zero2":  # bf16 reduce-scatter of gradients, all-gather of updated weights
        t = share * 2 * n / hw.collective("reduce_scatter", nodes) + share * 2 * n / hw.collective("all_gather", nodes)
    else:  # zero3: weights gathered for forward and backward, gradients reduce-scattered
        t = w.cfg.grad_accum * share * 2 * w.gathered_bytes / hw.collective("all_gather", nodes)
        t += share * 2 * n / hw.collective("reduce_scatter", nodes)
    latency = w.cfg.grad_accum * w.layers * COLLECTIVE_LATENCY_PER_BLOCK.get(name, 0.0)
    return max(t - HIDDEN_BEHIND_COMPUTE[name] * compute, 0.0) + latency


def step_time(w: Workload, hw: Hardware) -> StepTime:
    gpu = _gpu_work(w, hw)
    compute, host = sum(gpu.values()), _host(w) * hw.host_scale
    network = _network(w, hw, compute)
    # host-bound: the GPU idles between launches; GPU-bound: part of the host's work still shows
    gaps = LAUNCH_GAPS.get(w.strategy.name, LAUNCH_GAPS_COMPILED if w.cfg.compile is True else LAUNCH_GAPS_DEFAULT)
    busy = host if host > compute else compute + gaps * host
    busy += DEEPSPEED_PER_MICRO_S * w.cfg.grad_accum if w.deepspeed else 0.0
    parts = gpu | {"host": host, "network (exposed)": network}
    offloaded = gpu["optimizer"] if w.offloaded else 0.0  # the host's CPU Adam and PCIe copies, in the step
    host_side, gpu_side = host + offloaded, compute - offloaded
    bound = "network" if network > 0.25 * busy else ("host" if host_side > gpu_side else "GPU")
    copies = _activation_copies(w)  # offload=activations: each way on its own stream, beside the compute
    if copies:
        exposed = max(copies - compute, COPIES_EXPOSED * copies)
        parts["activation copies (exposed)"] = exposed
        busy += exposed
        bound = "host link" if copies > compute else bound
    return StepTime(busy + network, parts, bound)


def _activation_copies(w: Workload) -> float:
    """Seconds of one direction's copies of the saved activations (offload=activations), per step."""
    if not w.activations_offloaded:
        return 0.0
    return activations(w).saved_by_blocks(w) * w.cfg.grad_accum / ACTIVATION_COPY_BYTES_PER_S
