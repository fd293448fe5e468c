"""Parameter counts from a model's shape alone (no torch): what checks, warnings and plans need to know.

Decoder families (models.families: Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, and the mixture-of-experts Mixtral
and Qwen3-MoE) and GPT-2 (fused qkv with biases, learned positions, LayerNorm). Tested against the
instantiated presets, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunebench.models.families import Experts, Family, experts_of, family_of
from tunebench.models.spec import ModelSpec


@dataclass(frozen=True)
class Linear:
    name: str  # the module's own name (q_proj, c_attn, experts.gate_up_proj, ...), what lora_targets match
    fan_in: int
    fan_out: int
    kind: Literal["linear", "router", "experts"] = "linear"
    copies: int = 1  # experts: one matrix per expert
    active: int = 1  # experts: the ones a token passes through

    @property
    def size(self) -> int:
        return self.fan_in * self.fan_out * self.copies

    @property
    def active_size(self) -> int:
        """The weights one token multiplies by."""
        return self.fan_in * self.fan_out * self.active


@dataclass(frozen=True)
class Counts:
    total: int  # every parameter (a tied head counted once, with the embeddings)
    block_linears: int  # the weights of every block's linear layers and experts (what QLoRA quantizes)
    head: int  # the output head's matmul (vocab x hidden), tied or not
    per_block: int  # one transformer block (the mean block where blocks differ)
    linears: tuple[Linear, ...] = ()  # one block's linear layers, in order (a sparse block's for an MoE)
    tied: bool = False  # the head shares the embeddings' weight
    embeddings: int = 0  # token (and learned position) embeddings
    experts: int = 0  # mixture of experts: the experts' weights, all of them (part of block_linears)
    active_experts: int = 0  # ... those one token multiplies by
    routers: int = 0  # the routers' weights (trained in full fine-tuning, never quantized)
    tensors: int = 0  # parameter tensors (a tied head once): what per-tensor hooks and checks iterate over

    @property
    def block_matmul(self) -> int:
        """Block weights one token multiplies by: every linear, the routers, its own experts only."""
        return self.block_linears - self.experts + self.active_experts + self.routers

    @property
    def matmul(self) -> int:
        """Weights of every matmul one token goes through, the head included (embeddings and norms not): MFU's N."""
        return self.block_matmul + self.head


def _attention(f: Family, s: dict, hidden: int, heads: int, kv: int, head_dim: int) -> tuple[list[Linear], int]:
    """Attention's linears and its other parameters (biases, q/k norms)."""
    q, k = heads * head_dim, kv * head_dim
    if f.fused:
        shapes = [Linear("qkv_proj", hidden, q + 2 * k), Linear("o_proj", q, hidden)]
    else:
        shapes = [Linear("q_proj", hidden, q), Linear("k_proj", hidden, k), Linear("v_proj", hidden, k),
                  Linear("o_proj", q, hidden)]
    extra = 0
    if f.qkv_bias:  # Qwen2's, whatever attention_bias says
        extra += q + 2 * k
    elif s.get("attention_bias") and "attention_bias" in f.biases:
        extra += q + 2 * k + hidden
    if f.qk_norm:
        extra += 2 * head_dim
    return shapes, extra


def _mlp(f: Family, hidden: int, inter: int, bias: bool) -> tuple[list[Linear], int]:
    if f.fused:
        shapes = [Linear("gate_up_proj", hidden, 2 * inter), Linear("down_proj", inter, hidden)]
    else:
        shapes = [Linear("gate_proj", hidden, inter), Linear("up_proj", hidden, inter),
                  Linear("down_proj", inter, hidden)]
    return shapes, (2 * inter + hidden if bias else 0)


def _decoder(f: Family, spec: ModelSpec) -> Counts:
    s, layers, hidden, vocab = spec.shape, spec.num_layers, spec.hidden_size, spec.vocab_size
    heads, head_dim = spec.num_heads, spec.head_dim
    attn, attn_extra = _attention(f, s, hidden, heads, s.get("num_key_value_heads") or heads, head_dim)
    norms = f.norms * hidden
    ex = experts_of(s, layers)
    dense, dense_extra = _mlp(f, hidden, s.get("intermediate_size") or 0,
                              bool(s.get("mlp_bias")) and "mlp_bias" in f.biases)
    dense_block = sum(lin.size for lin in attn + dense) + attn_extra + dense_extra + norms
    if ex is None:
        blocks, linears = layers * dense_block, tuple(attn + dense)
        block_linears, experts, active, routers = layers * sum(lin.size for lin in attn + dense), 0, 0, 0
    else:
        router = Linear("gate", hidden, ex.count, kind="router")
        moe = [Linear("experts.gate_up_proj", hidden, 2 * ex.width, "experts", ex.count, ex.active),
               Linear("experts.down_proj", ex.width, hidden, "experts", ex.count, ex.active)]
        sparse_block = sum(lin.size for lin in attn + moe) + router.size + attn_extra + norms
        dense_layers = layers - ex.sparse
        blocks = ex.sparse * sparse_block + dense_layers * dense_block
        linears = tuple(attn + [router] + moe)
        experts = ex.sparse * sum(lin.size for lin in moe)
        block_linears = layers * sum(lin.size for lin in attn) + experts + dense_layers * sum(lin.size for lin in dense)
        active = ex.sparse * sum(lin.active_size for lin in moe)
        routers = ex.sparse * router.size
    tied = bool(s.get("tie_word_embeddings"))
    head = 0 if tied else vocab * hidden
    total = vocab * hidden + blocks + hidden + head
    return Counts(total, block_linears, vocab * hidden, blocks // layers, linears, tied, vocab * hidden, experts,
                  active, routers, _tensors(f, s, layers, linears, dense, ex) + 2 + (0 if tied else 1))


def _tensors(f: Family, s: dict, layers: int, linears: tuple[Linear, ...], dense: list[Linear],
             ex: Experts | None) -> int:
    """The blocks' parameter tensors: each linear's weight (the experts' stacked in one), its bias where the family
    has one, the norms."""
    attn = [lin for lin in linears if lin.name.endswith(("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"))]
    biases = 0
    if f.qkv_bias:
        biases = len(attn) - 1
    elif s.get("attention_bias") and "attention_bias" in f.biases:
        biases = len(attn)
    per_block = len(attn) + biases + f.norms + 2 * f.qk_norm
    mlp = len(dense) * (2 if s.get("mlp_bias") and "mlp_bias" in f.biases else 1)
    if ex is None:
        return layers * (per_block + mlp)
    return ex.sparse * (per_block + len(linears) - len(attn)) + (layers - ex.sparse) * (per_block + mlp)


def _gpt2(s: dict, layers: int, hidden: int, vocab: int) -> Counts:
    inner = s.get("n_inner") or 4 * hidden
    positions = s.get("n_positions") or 1024
    block = 2 * hidden + (hidden * 3 * hidden + 3 * hidden) + (hidden * hidden + hidden) + 2 * hidden \
        + (hidden * inner + inner) + (inner * hidden + hidden)
    shapes = (Linear("c_attn", hidden, 3 * hidden), Linear("c_proj", hidden, hidden), Linear("c_fc", hidden, inner),
              Linear("c_proj", inner, hidden))
    linears = layers * sum(lin.size for lin in shapes)
    embeddings = vocab * hidden + positions * hidden
    tied = s.get("tie_word_embeddings", True)
    # a block: four linears and two LayerNorms, each a weight and a bias; then wte, wpe and ln_f's two
    return Counts(embeddings + layers * block + 2 * hidden + (0 if tied else vocab * hidden), linears, vocab * hidden,
                  block, shapes, tied, embeddings, tensors=layers * 12 + 4 + (0 if tied else 1))


def counts(spec: ModelSpec) -> Counts | None:
    """The model's parameter counts, or None for an architecture this module does not know."""
    family = family_of(spec.shape)
    if family is None:
        return None
    if family.kind == "gpt2":
        return _gpt2(spec.shape, spec.num_layers, spec.hidden_size, spec.vocab_size)
    return _decoder(family, spec)


BYTES = {"fp32": 4, "bf16": 2, "bf16-pure": 2, "fp16": 2}
OPTIMIZER_BYTES = {"adamw": 8, "adamw_fused": 8, "adamw_8bit": 2, "paged_adamw_8bit": 2}  # per trainable parameter


def training_floor_bytes(c: Counts, method: str, precision: str, optimizer: str) -> int:
    """A lower bound on a training run's memory: weights, gradients and optimizer state (no activations).

    Full fine-tuning keeps fp32 weights (the master copy) with fp32 gradients; LoRA keeps the frozen base in
    the compute precision and trains a few adapters; QLoRA stores the block linears in 4 bits."""
    if method == "full" and precision == "bf16-pure":  # weights, gradients and AdamW's states all in bf16
        return c.total * (2 + 2 + min(OPTIMIZER_BYTES[optimizer], 4))
    if method == "full":
        return c.total * (4 + 4 + OPTIMIZER_BYTES[optimizer])
    per = BYTES.get(precision, 2)
    if method == "qlora":  # block linears at 4 bits; embeddings, norms and the head in the compute precision
        return c.block_linears // 2 + (c.total - c.block_linears) * per
    return c.total * per
