"""FLOPs per token, MFU and HFU against values computed by hand from docs/metrics.md."""

import pytest

from tunebench import RunConfig
from tunebench.methods import apply_method
from tunebench.metrics.flops import flops_per_token, peak_flops, utilization
from tunebench.metrics.stats import percentile, summarize
from tunebench.models import load_meta_model, resolve_model

# GPT-2 small: per block c_attn 768x2304 + c_proj 768x768 + c_fc 768x3072 + mlp c_proj 3072x768
GPT2_BLOCK = 768 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768
GPT2_HEAD = 768 * 50257
GPT2_N = 12 * GPT2_BLOCK + GPT2_HEAD


def _flops(name: str, cfg: RunConfig):
    spec = resolve_model(name)
    model = apply_method(load_meta_model(spec, cfg), cfg)  # meta: shapes only
    head = (model.get_base_model() if hasattr(model, "get_base_model") else model).get_output_embeddings()
    assert cfg.ckpt_every == 1 and cfg.ckpt_keep == "input"  # with grad_ckpt, every block's forward runs twice
    return flops_per_token(model, head, spec.num_layers, spec.num_heads, spec.head_dim, cfg.seq_len,
                           1.0 if cfg.grad_ckpt else 0.0)


def test_gpt2_small_full_training():
    f = _flops("tinygpt-124m", RunConfig(model="tinygpt-124m", seq_len=2048))
    assert GPT2_N == 123_532_032
    assert f.n_trainable == GPT2_N and f.n_frozen == 0
    assert f.model == 6 * 123_532_032 + 6 * 12 * 12 * 64 * 2048 == 854_438_400
    assert f.hardware == f.model  # no checkpointing, fused loss: nothing computed twice
    assert "6*N_matmul" in f.formula


def test_full_attention_mfu_as_the_references_count_it():
    """PaLM / torchtitan: 6N + 12*L*H*head_dim*S; stored beside our causal MFU as mfu_noncausal."""
    f = _flops("tinygpt-124m", RunConfig(model="tinygpt-124m", seq_len=2048))
    assert f.model_noncausal == 6 * GPT2_N + 12 * 12 * 12 * 64 * 2048
    from tunebench.metrics.aggregate import combine_ranks
    from tunebench.record import RankFigures

    rank = RankFigures(rank=0, timed_steps=10, tokens=16384 * 10, samples=80, wall_s=1.0, step_times=[0.1] * 10)
    m = combine_ranks([rank], [1.0], f, 989e12)
    assert m.mfu == pytest.approx(f.model * m.tokens_per_s_per_gpu / 989e12)
    assert m.mfu_noncausal == pytest.approx(f.model_noncausal * m.tokens_per_s_per_gpu / 989e12)
    assert m.mfu_noncausal > m.mfu


def test_gpt2_small_hfu_with_checkpointing():
    f = _flops("tinygpt-124m", RunConfig(model="tinygpt-124m", seq_len=1024, grad_ckpt=True))
    attn = 6 * 12 * 12 * 64 * 1024
    assert f.model == 6 * GPT2_N + attn
    assert f.hardware == f.model + 2 * 12 * GPT2_BLOCK + attn / 3


def test_lora_tiny_llama():
    # tiny-llama: hidden 64, intermediate 176, 2 layers, 4 heads (kv 2, head_dim 16), vocab 1024
    f = _flops("tiny-llama", RunConfig(model="tiny-llama", method="lora", lora_rank=8, seq_len=64))
    linears = [(64, 64), (64, 32), (64, 32), (64, 64), (64, 176), (64, 176), (176, 64)]  # q k v o gate up down
    frozen = 2 * sum(i * o for i, o in linears) + 64 * 1024  # + lm_head
    trainable = 2 * sum(8 * (i + o) for i, o in linears)  # A (r x in) and B (out x r)
    assert (f.n_frozen, f.n_trainable) == (frozen, trainable) == (157_696, 18_688)
    assert f.model == 4 * frozen + 6 * trainable + 6 * 2 * 4 * 16 * 64 == 792_064
    assert "4*N_frozen + 6*N_trainable" in f.formula


def test_mfu_arithmetic():
    assert utilization(854_438_400, 100_000, 989e12) == pytest.approx(854_438_400 * 1e5 / 989e12)
    assert utilization(1.0, 1.0, None) is None


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A10", 125e12), ("NVIDIA L4", 121e12),
    ("NVIDIA L40S", 362e12), ("NVIDIA A10G", None), ("Tesla T4", None), (None, None),
])
def test_peak_table(name, peak):
    assert peak_flops(name) == peak


def test_step_time_stats():
    v = [0.1, 0.2, 0.3, 0.4, 1.0]
    assert percentile(v, 50) == 0.3
    assert percentile(v, 90) == pytest.approx(0.4 + 0.6 * 0.6)
    s = summarize(v)
    assert s["mean"] == pytest.approx(0.4) and s["std"] == pytest.approx(0.3535533905932738)
