"""Parameter counts from a model's shape alone (no torch): what checks, warnings and plans need to know.

Llama/Mistral-style decoders (q, k, v, o; gate, up, down; RMSNorm) and GPT-2 (fused qkv with biases,
learned positions, LayerNorm). Tested against the instantiated presets, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from tunebench.models.spec import ModelSpec


@dataclass(frozen=True)
class Linear:
    name: str  # the module's own name (q_proj, c_attn, ...), what lora_targets match
    fan_in: int
    fan_out: int

    @property
    def size(self) -> int:
        return self.fan_in * self.fan_out


@dataclass(frozen=True)
class Counts:
    total: int  # every parameter (a tied head counted once, with the embeddings)
    block_linears: int  # the weights of every block's linear layers (what QLoRA quantizes)
    head: int  # the output head's matmul (vocab x hidden), tied or not
    per_block: int  # one transformer block
    linears: tuple[Linear, ...] = ()  # one block's linear layers, in order
    tied: bool = False  # the head shares the embeddings' weight
    embeddings: int = 0  # token (and learned position) embeddings

    @property
    def matmul(self) -> int:
        """Weights of every matmul, the head included (embeddings and norms not): the MFU's N."""
        return self.block_linears + self.head


def _llama(s: dict, layers: int, hidden: int, heads: int, head_dim: int, vocab: int) -> Counts:
    kv = s.get("num_key_value_heads") or heads
    inter = s["intermediate_size"]
    attn = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    if s.get("attention_bias"):
        attn += heads * head_dim + 2 * kv * head_dim + hidden
    mlp = 3 * hidden * inter + (2 * inter + hidden if s.get("mlp_bias") else 0)
    block = attn + mlp + 2 * hidden
    tied = bool(s.get("tie_word_embeddings"))
    head = 0 if tied else vocab * hidden
    shapes = (Linear("q_proj", hidden, heads * head_dim), Linear("k_proj", hidden, kv * head_dim),
              Linear("v_proj", hidden, kv * head_dim), Linear("o_proj", heads * head_dim, hidden),
              Linear("gate_proj", hidden, inter), Linear("up_proj", hidden, inter), Linear("down_proj", inter, hidden))
    linears = layers * sum(lin.size for lin in shapes)
    return Counts(vocab * hidden + layers * block + hidden + head, linears, vocab * hidden, block, shapes, tied,
                  vocab * hidden)


def _gpt2(s: dict, layers: int, hidden: int, vocab: int) -> Counts:
    inner = s.get("n_inner") or 4 * hidden
    positions = s.get("n_positions") or 1024
    block = 2 * hidden + (hidden * 3 * hidden + 3 * hidden) + (hidden * hidden + hidden) + 2 * hidden \
        + (hidden * inner + inner) + (inner * hidden + hidden)
    shapes = (Linear("c_attn", hidden, 3 * hidden), Linear("c_proj", hidden, hidden), Linear("c_fc", hidden, inner),
              Linear("c_proj", inner, hidden))
    linears = layers * sum(lin.size for lin in shapes)
    embeddings = vocab * hidden + positions * hidden
    return Counts(embeddings + layers * block + 2 * hidden, linears, vocab * hidden, block, shapes,
                  s.get("tie_word_embeddings", True), embeddings)


def counts(spec: ModelSpec) -> Counts | None:
    """The model's parameter counts, or None for an architecture this module does not know."""
    s = spec.shape
    family = s.get("model_type") or ("gpt2" if "n_layer" in s else "llama")
    if family == "gpt2":
        return _gpt2(s, spec.num_layers, spec.hidden_size, spec.vocab_size)
    if family in ("llama", "mistral", "qwen2") and "intermediate_size" in s:
        return _llama(s, spec.num_layers, spec.hidden_size, spec.num_heads, spec.head_dim, spec.vocab_size)
    return None


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
