"""Model zoo: presets are the public models' exact shapes, as plain data (no torch, no transformers).

Weights are random (exact for throughput and memory); nothing is downloaded. Add a preset with one
entry: a name, the transformers config family and the shape keys of its config.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# family -> the transformers config class (imported only when a model is built)
FAMILIES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "gpt2": "GPT2Config"}


@dataclass(frozen=True)
class Preset:
    family: str
    shape: dict[str, Any] = field(default_factory=dict)

    def hf_config(self) -> Any:
        import transformers

        return getattr(transformers, FAMILIES[self.family])(**self.shape)


PRESETS: dict[str, Preset] = {
    # A few layers and a small hidden size: the CPU test model.
    "tiny-llama": Preset("llama", dict(vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)),
    # GPT-2 small, the seeds' "TinyGPT" (12 layers, 768 hidden, 12 heads), with 2048 positions.
    "tinygpt-124m": Preset("gpt2", dict(vocab_size=50257, n_positions=2048, n_embd=768, n_layer=12, n_head=12)),
    # GPT-2 medium (24 layers, 1024 hidden, 16 heads), its own 1024 positions.
    "gpt2-medium": Preset("gpt2", dict(vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16)),
    "llama-3.2-1b": Preset("llama", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-5, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    # Mistral-7B v0.3: 32768 vocabulary, no sliding window.
    "mistral-7b": Preset("mistral", dict(
        vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=32768, rope_theta=1000000.0, sliding_window=None,
        rms_norm_eps=1e-5)),
    "llama-3-8b": Preset("llama", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5)),
    # 70.6 B parameters: bigger than one GPU (141 GB in bf16); fsdp builds it on meta and makes each rank's shard
    "llama-3-70b": Preset("llama", dict(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5)),
    "llama-3.1-70b": Preset("llama", dict(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})),
}
