"""Model zoo: presets are Hugging Face configs with the public models' exact shapes.

Weights are random (exact for throughput and memory); nothing is downloaded. Add a preset by adding
one entry: a name and a function returning a transformers config.
"""

from __future__ import annotations

from typing import Callable

from transformers import GPT2Config, LlamaConfig, MistralConfig, PretrainedConfig


def tiny_llama() -> PretrainedConfig:
    # A few layers and a small hidden size: the CPU test model.
    return LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)


def tinygpt_124m() -> PretrainedConfig:
    # GPT-2 small, the seeds' "TinyGPT" (12 layers, 768 hidden, 12 heads), with 2048 positions.
    return GPT2Config(vocab_size=50257, n_positions=2048, n_embd=768, n_layer=12, n_head=12)


def llama_3_2_1b() -> PretrainedConfig:
    return LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                       rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def mistral_7b() -> PretrainedConfig:
    # Mistral-7B v0.3: 32768 vocabulary, no sliding window.
    return MistralConfig(vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                         rope_theta=1000000.0, sliding_window=None, rms_norm_eps=1e-5)


def llama_3_8b() -> PretrainedConfig:
    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       rope_theta=500000.0, rms_norm_eps=1e-5)


PRESETS: dict[str, Callable[[], PretrainedConfig]] = {
    "tiny-llama": tiny_llama,
    "tinygpt-124m": tinygpt_124m,
    "llama-3.2-1b": llama_3_2_1b,
    "mistral-7b": mistral_7b,
    "llama-3-8b": llama_3_8b,
}
