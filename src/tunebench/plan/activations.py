"""Bytes autograd keeps for backward, per token, for one transformer block and around the blocks.

Counted op by op for the Hugging Face implementations our engine runs, with the dtypes of
plan.workload, SDPA's flash kernel (it keeps q, k, v, the output and one fp32 logsumexp per head),
and checked against the bytes saved per block on GPUs (benchmarks/probes/memory_probe.py; the records
are in tests/data/planner): each line below names what it keeps, with h the hidden size, i the MLP
width, q the query width (heads x head_dim), kv the key/value width, H the heads.

Llama/Mistral block, bf16 weights without autocast (DeepSpeed):
  RMSNorm x2: its fp32 copy of the input (4h) and the normalized bf16 value (2h), output (2h)   16h
  attention: roped q (2q), k and v (4kv), the output (2q, o_proj's input too), logsumexp (4H)
  MLP: gate and up outputs, SiLU output, their product (4 x 2i)                                   8i
  (LoRA: 12h for the norms, whose frozen weights need no normalized value kept)
Under autocast with bf16 weights (FSDP2, LoRA bases) 4h more were measured; with fp32 master weights
(single, DDP) the residual is fp32 and every linear casts its own bf16 copy of the input: 28h.
GPT-2 block under autocast: LayerNorm inputs, the fused qkv (6h), dropout masks (1 byte each), and
NewGELU written out in Python, whose pow/tanh run in fp32 under autocast (14 x inner bytes).
torch.compile keeps what its min-cut partitioner chooses: measured, 12h + 4i (+ attention) on Llama with
bf16 weights, 4h more with LoRA/QLoRA adapters; the whole model as one graph 2h more than per block.
fp32 (every tensor 4 bytes): on a GPU grouped keys and values are repeated to the query's heads before SDPA
(models.attention), so attention keeps q, k, v and its output at 4q each. Compiled, counted tensor by tensor
(autograd's saved tensors, whole model, CPU): Llama 16h + 12i + 16q + 4H + 8 (the norms' inputs and matmul
inputs, gate, up and their product, attention's set, the norms' rstd), GPT-2 32h + 8i + 4H + 8 (fused qkv 12h,
attention's output, LayerNorms' inputs and outputs, c_fc's output and GELU's).
float8 (a full fine-tune's compiled blocks, torchao's linears): 3h + 2i fewer, float8 copies where bf16 ones were
(CPU, saved tensors); under FSDP2 with tensorwise scales each block's float8 weights kept too (1 byte a weight).
LoRA adds each adapter's rank-r output, and no copy of an adapter's input: peft casts that input to the
adapters' fp32, yet nothing more is kept, under autocast or under DeepSpeed (whose bf16 engine casts the
adapters too); checked on the CPU (a test) and on GPUs (benchmarks/results/planner.md).
Other decoder families keep what a Llama block of their shape keeps, plus (measured on the CPU per family with
autograd's saved tensors, eager and compiled; tests/test_families.py):
  Gemma's two more norms (four a block, computed in fp32): 20h without autocast, 8h under autocast with a frozen
  base, 16h with fp32 weights, 2h compiled
  q/k norms (Qwen3, Gemma 3) over q and kv: 6 bytes each (Gemma's 8), 4 under autocast with a frozen base, 2
  compiled; and their fp32 rstd per head
  Phi-3's fused qkv projection: its output, 2(q + 2kv), without autocast; q + 2kv + h compiled
  a mixture of experts, per token for its k experts of width I (in place of the dense MLP): the experts' gated
  MLP 8kI (4kI compiled, 6kI frozen under autocast), the tokens gathered by expert and the experts' outputs 4kh
  (2kh frozen under autocast, 3.5kh compiled, 2kh compiled under autocast, 3.5kh with fp32 weights under autocast,
  their experts cast to bf16 by models.experts), the router's fp32 probabilities 4E and the sort's indices 48k; LoRA
  on an expert weight keeps that projection's input too (kh or kI); compiled with neither experts nor router
  adapted, the block's norms keep 6h: its two residuals and attention's normed input, as nothing of the MLP's norm
  is needed where no adapter reads it (the GPU probe: benchmarks/results/families.md)
"""

from __future__ import annotations

from dataclasses import dataclass

from tunebench.plan.workload import Workload


@dataclass(frozen=True)
class Activations:
    per_layer: float  # bytes per token kept by one block for backward (its full forward)
    kept_per_layer: float  # bytes per token one block keeps through the forward (= per_layer without checkpointing)
    outside: float  # bytes per token kept outside the blocks (final norm, loss)
    attention: str  # the SDPA kernel the planner assumes ("flash", "memory-efficient" or "math")
    note: str
    final_norm: float = 0.0  # of outside, the final norm's: freed by its backward, before any block's
    # bytes a block keeps for backward whatever the tokens (adapted experts' factors, FSDP2's float8 weights)
    per_block: float = 0.0
    routing: float = 0.0  # of per_layer, a mixture of experts' routing (router probabilities, sort and gather indices)
    # bytes per token a block holds in its backward after its traced recompute, where counted whole (None: per_layer
    # and the backward's temporaries, plan.memory)
    traced_backward: float | None = None
    # bytes per token that float8 blocks keep fewer than bf16's: their casts still read what bf16's kept (plan.speed
    # counts elementwise traffic by bf16's bytes)
    float8_fewer: float = 0.0

    def saved_by_blocks(self, w: Workload) -> float:
        """Bytes every block keeps through one micro-batch's forward (what offload=activations copies)."""
        kept = (1 - w.checkpointed_share) * (w.experts.sparse if w.experts else w.layers) * self.per_block
        return w.tokens * w.layers * self.kept_per_layer + kept


def _attention_kernel(w: Workload) -> str:
    # SDPA picks flash (or cuDNN) for bf16 without a mask; the eager implementation materialises S x S.
    # fp32 has no flash kernel; the memory-efficient one keeps the same tensors.
    return "math" if w.cfg.attn == "eager" else "memory-efficient" if w.fp32 else "flash"


def _mode(w: Workload) -> str:
    """How the block runs, as the measured terms are keyed: fp32, compiled, plain (no autocast), lora (autocast over a
    frozen 16-bit base) or fp32 weights under autocast."""
    if w.fp32:
        return "fp32"
    if w.cfg.compile:
        return "compiled"
    if not w.autocast:
        return "plain"
    return "lora" if w.residual_bytes == 2 else "fp32-weights"


def _mlp(w: Workload, dense: float) -> float:
    """The MLP's bytes per token: `dense` for a dense MLP of the model's width, else its experts' (module doc); a
    chunked MLP keeps only its input, the norm's output, which the norms' term counts already."""
    if w.chunked_mlp:
        return 0.0
    if not w.experts:
        return dense
    ex, h, mode = w.experts, w.spec.hidden_size, _mode(w)
    ki, kh = ex.active * ex.width, ex.active * h
    route = routing(w)
    if mode == "compiled":
        return 4 * ki + (3.5 if w.full else 2.0) * kh + route + _adapted_expert_inputs(w)
    if mode == "fp32":
        return 2 * (8 * ki + 4 * kh) + route
    if mode == "lora":
        return 6 * ki + 2 * kh + route + _adapted_expert_inputs(w)
    return 8 * ki + {"plain": 4.0}.get(mode, 3.5) * kh + route


def _adapted_expert_inputs(w: Workload) -> float:
    """Frozen experts keep neither projection's routed input (their GEMMs need only the weights in backward); an
    adapter on an expert weight keeps it, for its A's gradient: the gathered tokens (k h) or the gated product (k I)."""
    return sum(w.compute_bytes * t.fan_in * w.experts.active for t in w.targets if t.kind == "experts")


def routing(w: Workload) -> float:
    """A sparse block's routing, per token: the router's fp32 probabilities over E experts, and the int64 indices of
    the k experts chosen, sorted and gathered."""
    return 4 * w.experts.count + 48 * w.experts.active if w.experts else 0.0


def _family_extra(w: Workload) -> float:
    """Bytes per token a block of this family keeps beyond a Llama block of its shape (module doc)."""
    f, s = w.arch, w.spec
    if f is None or f.kind != "decoder":
        return 0.0
    h, heads, mode = s.hidden_size, s.num_heads, _mode(w)
    kv_heads = s.shape.get("num_key_value_heads") or heads
    q, kv = heads * s.head_dim, kv_heads * s.head_dim
    scale = 2.0 if mode == "fp32" else 1.0  # every tensor 4 bytes: the plain terms twice
    extra = 0.0
    if f.norms > 2:
        extra += (f.norms - 2) / 2 * {"compiled": 2, "lora": 8, "fp32-weights": 16}.get(mode, 20 * scale) * h
    if f.qk_norm:
        per = {"compiled": 2, "lora": 4}.get(mode, (8 if f.norms > 2 else 6) * scale)
        extra += per * (q + kv) + 4 * (heads + kv_heads)
    if f.fused:
        extra += (q + 2 * kv + h) if mode == "compiled" else 2 * (q + 2 * kv) * scale if mode in ("plain", "fp32") \
            else 0.0
    return extra


def _llama_block(w: Workload) -> float:
    s = w.spec
    h, q, i, heads = s.hidden_size, s.num_heads * s.head_dim, w.mlp_width, s.num_heads
    kv = (s.shape.get("num_key_value_heads") or heads) * s.head_dim
    attention = 2 * q + 4 * kv + 2 * q + 4 * heads  # flash: q, k, v, output, logsumexp
    extra = _family_extra(w)
    if w.fp32:  # keys and values repeated to q's width (models.attention); 4 bytes each
        fp32_attention = 4 * q + 8 * q + 4 * q + 4 * heads
        if w.cfg.compile:
            return 16 * h + _mlp(w, 12 * i) + fp32_attention + 8 + extra
        return 24 * h + _mlp(w, 16 * i) + fp32_attention + extra  # RMSNorm's cast is a no-op: input, normalized, output
    if w.cfg.compile:  # measured: adapters keep 4h more (peft's and bitsandbytes' calls split the graph)
        if _frozen_mlp(w):  # the two residuals and attention's normed input only: nothing of the MLP's norm, no 4h
            return 6 * h + attention + _mlp(w, 4 * i) + extra
        norms = 12 * h if w.residual_bytes == 2 else 16 * h
        return norms + attention + _mlp(w, 4 * i) + (0 if w.full else 4 * h) + extra
    if not w.autocast:  # a frozen RMSNorm weight needs no normalized value kept (LoRA under DeepSpeed)
        return (16 if w.full else 12) * h + attention + _mlp(w, 8 * i) + extra
    norms = 20 * h if w.residual_bytes == 2 else 24 * h
    return norms + attention + _mlp(w, 8 * i) + extra


def _frozen_mlp(w: Workload) -> bool:
    """Every block's MLP is experts whose router no adapter touches: backward needs nothing of the MLP's normed
    input (frozen experts need only their weights; adapted ones keep the tokens they gathered from it, counted with
    the experts), nor of its norm (benchmarks/probes/memory_probe.py --peak-live shows what is kept)."""
    return (not w.full and bool(w.experts) and w.experts.sparse == w.layers
            and all(t.kind != "router" for t in w.targets))


def _gpt2_block(w: Workload) -> float:
    s = w.spec
    h, heads = s.hidden_size, s.num_heads
    inner = 0 if w.chunked_mlp else s.shape.get("n_inner") or 4 * h  # every inner-wide tensor is the MLP's
    attention = 6 * h + 2 * h + 4 * heads  # fused qkv, output (also c_proj's input), logsumexp
    # the fits below ran with GPT-2's dropout: the two residual dropouts' masks (1 byte each) go without it
    masks = 0 if w.dropout else -2 * h
    if w.fp32:
        if w.cfg.compile:
            return 32 * h + 8 * inner + 4 * heads + 8 + 2 * h + masks
        return 2 * (10 * h + 10 * inner) + 2 * h + attention * 2 + masks
    if w.cfg.compile:  # DeepSpeed's bf16 module keeps 2h less (benchmarks/probes/memory_probe.py --peak-live, ZeRO-2)
        return (11 if w.deepspeed else 13) * h + 4 * inner + attention + masks
    if not w.autocast:  # bf16 everywhere: LayerNorm inputs and outputs, GELU's four bf16 intermediates
        return 10 * h + 10 * inner + attention + masks
    return 15 * h + 16 * inner + attention + masks  # one h more than counted was measured


def _matmul_outputs(w: Workload) -> float:
    """What a block checkpointed with ckpt_keep=matmuls keeps besides its input: each large matmul's output,
    and attention's output and logsumexp (engine.recompute's policy; the adapters' rank-r outputs in _adapters)."""
    s, b = w.spec, w.compute_bytes
    h, heads = s.hidden_size, s.num_heads
    if w.family == "llama":
        q, i = heads * s.head_dim, w.mlp_width
        kv = (s.shape.get("num_key_value_heads") or heads) * s.head_dim
        return b * (q + 2 * kv + q + h + 2 * i + h) + 4 * heads  # q k v, attention, o, gate up, down
    inner = s.shape.get("n_inner") or 4 * h
    return b * (3 * h + h + h + inner + h) + 4 * heads  # qkv, attention, c_proj, c_fc, mlp's c_proj


def _attention_output(w: Workload) -> float:
    """QLoRA under ckpt_keep=matmuls: attention's output and logsumexp, and one key/value-wide tensor more
    (as the records of Mistral-7B show, benchmarks/results/planner.md)."""
    s = w.spec
    kv = (s.shape.get("num_key_value_heads") or s.num_heads) * s.head_dim
    return w.compute_bytes * (s.num_heads * s.head_dim + kv) + 4 * s.num_heads


def _adapters(w: Workload) -> float:
    """Each adapter's rank-r output per token (an MoE's experts' adapters: k of them)."""
    return sum(w.compute_bytes * r * t.active for t, r in zip(w.targets, w.ranks))


def _expert_factors(w: Workload) -> float:
    """Bytes a sparse block keeps for its experts' adapters whatever the tokens: each expert's A and B in the compute
    dtype, the grouped GEMMs' second operands (methods.expert_adapters)."""
    return sum(w.compute_bytes * r * (t.fan_in + t.fan_out) * t.copies
               for t, r in zip(w.targets, w.ranks) if t.kind == "experts")


def _math_attention_extra(w: Workload) -> float:
    """The math kernel keeps scaled q, repeated k and v and the S x S probabilities instead of flash's set."""
    s = w.spec
    q, heads = s.num_heads * s.head_dim, s.num_heads
    kv = (s.shape.get("num_key_value_heads") or heads) * s.head_dim
    return (6 * q + 2 * heads * w.cfg.seq_len) - (4 * q + 4 * kv + 4 * heads)


def _float8_linears(w: Workload) -> bool:
    """A dense full fine-tune's blocks compiled with torchao's float8 linears (models.float8), on a Llama-like block."""
    return w.full and w.cfg.float8 != "off" and bool(w.cfg.compile) and w.family == "llama" and not w.experts \
        and not w.fp32


def _float8_inputs(w: Workload) -> float:
    """Bytes a token a float8 block keeps fewer than bf16's: the partitioner keeps float8 copies (1 byte) where
    bf16's kept 2: 3h + 2i in all (autograd's saved tensors of a compiled Llama block of two MLP widths, on the
    CPU, either recipe; the same count fits Llama-3-8B's GPU runs under FSDP2)."""
    return 3 * w.spec.hidden_size + 2 * w.mlp_width if _float8_linears(w) else 0.0


def _float8_weights(w: Workload) -> float:
    """Bytes a block keeps whatever the tokens under FSDP2 with tensorwise float8: its weights arrive gathered in
    float8 and are freed after its forward, so backward keeps its own float8 copy of each (1 byte a weight, whole)."""
    if not (_float8_linears(w) and w.cfg.float8 == "tensorwise" and w.collectives == "fsdp"):
        return 0.0
    return w.counts.block_linears / w.layers


def _traced_full_backward(w: Workload, kernel: str) -> float | None:
    """A dense full fine-tune's block in its backward after its traced recompute, the last (backward's start) as the
    first (its end): its MLP's rebuilt and gradient tensors (six of the MLP's width), seven of the hidden size and
    two of the keys' width, and no next block's recompute begun beside them (benchmarks/probes/memory_probe.py
    --peak-live: Llama-3.2-1B at 32k tokens a step, 3B and 3.1-8B at 16k)."""
    if not (w.full and w.recompute_traced and w.checkpointed_share == 1) or w.experts or w.chunked_mlp \
            or kernel == "math":
        return None
    s = w.spec
    kv = (s.shape.get("num_key_value_heads") or s.num_heads) * s.head_dim
    return w.compute_bytes * (6 * w.mlp_width + 7 * s.hidden_size + 2 * kv)


def activations(w: Workload) -> Activations:
    block = _llama_block(w) if w.family == "llama" else _gpt2_block(w)
    float8_fewer = _float8_inputs(w)
    block += _adapters(w) - float8_fewer
    if w.whole_graph and w.residual_bytes == 4 and not w.fp32:
        # one graph keeps about 2h more per block than blocks compiled apart: by its size a bf16 copy of the fp32
        # residual; a bf16 residual needs none (benchmarks/results/planner.md)
        block += 2 * w.spec.hidden_size
    kernel = _attention_kernel(w)
    if kernel == "math":
        block += _math_attention_extra(w)
    h = w.spec.hidden_size
    share = w.checkpointed_share  # checkpointed blocks keep their input (and with ckpt_keep=matmuls, those)
    matmuls = 0.0
    if w.cfg.ckpt_keep == "matmuls":  # unfused QLoRA (Workload.keeps_matmuls): attention's and adapters' outputs
        matmuls = (_matmul_outputs(w) if w.keeps_matmuls else _attention_output(w)) + _adapters(w)
    kept = share * w.residual_bytes * h + w.kept_share * matmuls + (1 - share) * block
    final_norm = (10 if w.residual_bytes == 4 else 8) * h
    outside = final_norm + w.compute_bytes * h  # the final norm, and the loss's gradient for the hidden states
    kept_what = "its matmuls' outputs" if w.keeps_matmuls else "attention's output (the 4-bit matmuls rerun)"
    note = (f"checkpointing: each block keeps its input and {kept_what}; the rest is rebuilt in backward"
            if share == 1 and w.kept_share == 1 and matmuls else
            f"checkpointing: each block keeps its input, one in {w.cfg.ckpt_keep_every} also {kept_what}; the rest "
            "is rebuilt in backward" if share == 1 and matmuls else
            "checkpointing: each block keeps its input; one block's activations are rebuilt in backward"
            if share == 1 else "every block keeps its activations until backward" if share == 0 else
            f"checkpointing one block in {w.cfg.ckpt_every}: those keep their input, the others everything")
    return Activations(block, kept, outside, kernel, note, final_norm, _expert_factors(w) + _float8_weights(w),
                       routing(w), _traced_full_backward(w, kernel), float8_fewer)
