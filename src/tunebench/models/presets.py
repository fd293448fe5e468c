"""Model zoo: presets are the public models' exact shapes, as plain data (no torch, no transformers).

Weights are random (exact for throughput and memory); nothing is downloaded. Add a preset with one
entry: a name, the transformers config family and the shape keys of its config.json (as the public model's
config.json has them). A family new to tunebench also needs its row in models.families (what its blocks hold).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# family -> the transformers config class (imported only when a model is built)
FAMILIES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "gpt2": "GPT2Config", "qwen2": "Qwen2Config",
            "qwen3": "Qwen3Config", "gemma2": "Gemma2Config", "gemma3_text": "Gemma3TextConfig", "phi3": "Phi3Config",
            "mixtral": "MixtralConfig", "qwen3_moe": "Qwen3MoeConfig"}


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


def _llama3(rope_factor: float, **shape: Any) -> dict[str, Any]:
    """Llama 3.1/3.2: 128K positions through llama3 RoPE scaling of the 8K it was pretrained at."""
    return dict(vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                rope_scaling={"rope_type": "llama3", "factor": rope_factor, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, **shape)


def _qwen25(**shape: Any) -> dict[str, Any]:
    """Qwen2.5 base models: 131,072 positions, biases on q/k/v (Qwen2's attention), untied head."""
    return dict(dict(vocab_size=152064, max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-5,
                     tie_word_embeddings=False, use_sliding_window=False), **shape)


def _qwen3(**shape: Any) -> dict[str, Any]:
    """Qwen3: q/k RMSNorms over each head, head_dim 128 whatever the width, 40,960 positions."""
    return dict(vocab_size=151936, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, **shape)


def _gemma2(**shape: Any) -> dict[str, Any]:
    """Gemma 2: tied 256K vocabulary, four norms a block, attention logits soft-capped at 50 and the output's at 30,
    every other layer a 4,096-token sliding window."""
    return dict(vocab_size=256000, max_position_embeddings=8192, rms_norm_eps=1e-6, rope_theta=10000.0,
                sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, **shape)


# Phi-3.5-mini's LongRoPE factors, one per rotary frequency (its config.json)
PHI35_LONG = [1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115,
              1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863,
              4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
              17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
              32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156,
              50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457,
              62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
              63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
              64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336,
              64.51000213623047, 64.52999877929688, 64.83999633789062]
PHI35_SHORT = [1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
               1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979,
               1.0999999046325684, 1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662,
               1.2899998426437378, 1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
               1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
               2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
               2.0199997425079346, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
               2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
               2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533,
               2.729999542236328, 2.749999523162842, 2.8399994373321533]

PRESETS |= {
    "llama-3.1-8b": Preset("llama", _llama3(8.0, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                            num_attention_heads=32, num_key_value_heads=8)),
    "llama-3.2-3b": Preset("llama", _llama3(32.0, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                                            num_attention_heads=24, num_key_value_heads=8, head_dim=128,
                                            tie_word_embeddings=True)),
    "qwen2.5-7b": Preset("qwen2", _qwen25(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                          num_attention_heads=28, num_key_value_heads=4, rms_norm_eps=1e-6)),
    "qwen2.5-14b": Preset("qwen2", _qwen25(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                                           num_attention_heads=40, num_key_value_heads=8)),
    "qwen2.5-32b": Preset("qwen2", _qwen25(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
                                           num_attention_heads=40, num_key_value_heads=8)),
    "qwen2.5-72b": Preset("qwen2", _qwen25(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                                           num_attention_heads=64, num_key_value_heads=8)),
    "qwen3-8b": Preset("qwen3", _qwen3(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                       num_attention_heads=32, num_key_value_heads=8)),
    "qwen3-14b": Preset("qwen3", _qwen3(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40,
                                        num_attention_heads=40, num_key_value_heads=8)),
    "qwen3-32b": Preset("qwen3", _qwen3(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                                        num_attention_heads=64, num_key_value_heads=8)),
    "gemma-2-9b": Preset("gemma2", _gemma2(hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
                                           num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                                           query_pre_attn_scalar=256)),
    "gemma-2-27b": Preset("gemma2", _gemma2(hidden_size=4608, intermediate_size=36864, num_hidden_layers=46,
                                            num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                                            query_pre_attn_scalar=144)),
    # Gemma 3 12B's language model (what Gemma3ForCausalLM trains): q/k norms instead of soft-capping, five
    # 1,024-token sliding-window layers to each global one, linear RoPE scaling on the global layers
    "gemma-3-12b": Preset("gemma3_text", dict(
        vocab_size=262208, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
        num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256, max_position_embeddings=131072,
        sliding_window=1024, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(48)],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})),
    # Phi-3's fused projections: one qkv_proj, one gate_up_proj
    "phi-3.5-mini": Preset("phi3", dict(
        vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=131072, original_max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=262144, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
        rope_scaling={"type": "longrope", "long_factor": PHI35_LONG, "short_factor": PHI35_SHORT})),
    "phi-4": Preset("phi3", dict(
        vocab_size=100352, hidden_size=5120, intermediate_size=17920, num_hidden_layers=40, num_attention_heads=40,
        num_key_value_heads=10, max_position_embeddings=16384, rope_theta=250000.0, rms_norm_eps=1e-5,
        sliding_window=None, tie_word_embeddings=False, bos_token_id=100257, eos_token_id=100265,
        pad_token_id=100349)),
    # Mistral NeMo 12B: head_dim 128 below hidden / heads, a 131,072-token vocabulary (Tekken)
    "mistral-nemo-12b": Preset("mistral", dict(
        vocab_size=131072, hidden_size=5120, intermediate_size=14336, num_hidden_layers=40, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=1024000, rope_theta=1000000.0,
        rms_norm_eps=1e-5, sliding_window=None)),
    # mixture of experts: 8 experts of Mistral-7B's MLP, 2 per token
    "mixtral-8x7b": Preset("mixtral", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None, router_aux_loss_coef=0.02)),
    # 128 experts of width 768, 8 per token (top-k weights renormalized); every layer sparse
    "qwen3-30b-a3b": Preset("qwen3_moe", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, router_aux_loss_coef=0.001)),
}
