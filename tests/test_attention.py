"""The registered SDPA (models.attention): grouped keys and values in fp32 on a GPU repeated to the query's heads, so
SDPA's memory-efficient kernel takes them instead of its math kernel (which keeps S x S probabilities)."""

import pytest
import torch
from torch import nn

from tunebench.models import attention

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: run on one, see benchmarks/results/full-finetune.md")


class _Grouped(nn.Module):
    """What transformers' attention modules carry into the attention function."""

    num_key_value_groups = 4
    is_causal = True


def _inputs(device: str, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(2, 8, 64, 32, device=device, dtype=dtype, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 64, 32, device=device, dtype=dtype, generator=g, requires_grad=True) for _ in range(2))
    return q, k, v


def _attend(q, k, v, mask=None):
    out, _ = attention._attention(_Grouped(), q, k, v, mask, plain_causal=mask is None, dropout=0.0)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    return out, grads


def test_repeated_keys_attend_as_grouped_ones(monkeypatch):
    """Repeated (the GPU's fp32 path, taken here on the CPU) or grouped by SDPA: the same output and gradients, the
    keys' and values' gradients summed back over their groups."""
    q, k, v = _inputs("cpu")
    assert not attention.repeats_kv(q)  # the CPU's flash kernel groups fp32 keys itself
    grouped = _attend(q, k, v)
    monkeypatch.setattr(attention, "repeats_kv", lambda query: True)
    repeated = _attend(q, k, v)
    for a, b in zip((grouped[0], *grouped[1]), (repeated[0], *repeated[1])):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_a_mask_leaves_the_repeat_to_transformers(monkeypatch):
    """With a mask transformers repeats the keys itself (SDPA cannot group them then): repeated once, not twice."""
    monkeypatch.setattr(attention, "repeats_kv", lambda query: True)
    q, k, v = _inputs("cpu")
    causal = torch.ones(64, 64, dtype=torch.bool).tril()[None, None].expand(2, 1, 64, 64)
    out, _ = _attend(q, k, v, causal)
    ref, _ = _attend(q, k, v)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@GPU
def test_fp32_grouped_attention_takes_the_memory_efficient_kernel():
    """On a GPU, fp32 with grouped keys: with SDPA held to its memory-efficient kernel ours runs forward and
    backward, transformers' own call (keys grouped by SDPA) finds no kernel; bf16 keeps grouping them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _inputs("cuda")
    assert attention.repeats_kv(q) and not attention.repeats_kv(q.detach().bfloat16())
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        out, grads = _attend(q, k, v)
        with pytest.raises(RuntimeError, match="No available kernel"):
            sdpa_attention_forward(_Grouped(), q, k, v, None, dropout=0.0)
    with sdpa_kernel([SDPBackend.MATH]):
        ref, ref_grads = _attend(q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_())
    for a, b in zip((out, *grads), (ref, *ref_grads)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
