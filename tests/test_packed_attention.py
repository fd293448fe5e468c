"""Packed rows' attention (models.attention): each example attended causally over itself alone, by torch's
variable-length flash kernel on a GPU, given the examples' bounds the data path computes (engine.data.documents_of).
On the CPU the layout around the kernel is checked against a reference kernel; the kernel itself on a GPU."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tunebench import RunConfig
from tunebench.data.prepare import fullest_row
from tunebench.engine.data import documents_of
from tunebench.models import attention

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: run on one, see benchmarks/results/training-jobs.md")
PACKED = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 0, 1, 2]])  # examples of 3, 4, 1 | 5, 3


def test_documents_mark_each_example_in_the_rows_flattened():
    assert documents_of(PACKED, None).tolist() == [0, 3, 7, 8, 13, 16]
    padded = documents_of(PACKED, 7)  # the job's capacity: examples of length 0 at the end
    assert padded.dtype == torch.int32 and padded.tolist() == [0, 3, 7, 8, 13, 16, 16, 16]
    # a row that does not start at position 0 still starts an example: rows never run into each other
    assert documents_of(torch.tensor([[2, 3, 0, 1], [5, 6, 7, 8]]), None).tolist() == [0, 2, 4, 8]
    with pytest.raises(ValueError, match="5 examples in a batch whose capacity is 4"):
        documents_of(PACKED, 4)


def test_the_fullest_row_counts_every_example_start():
    """A batch's capacity is the fullest row's examples times the batch (data.batches)."""
    rows = np.array([[0, 1, 0, 1], [0, 0, 0, 1], [3, 0, 1, 2]], dtype=np.int32)
    assert fullest_row(rows) == 3
    assert fullest_row(rows, chunk=1) == 3  # read a row at a time: the same
    assert fullest_row(rows[2:]) == 2  # the row's own start counts


def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, window_size=None, enable_gqa=False,
                      scale=None, **_):
    """The kernel's contract, example by example with SDPA: what torch's variable-length kernel computes."""
    assert is_causal or tuple(window_size) == (-1, 0)
    assert torch.equal(cu_q, cu_k) and max_q >= int((cu_q[1:] - cu_q[:-1]).max())
    out = torch.zeros_like(q)
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
        if b > a:
            x = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1),
                                               is_causal=True, scale=scale, enable_gqa=enable_gqa)
            out[a:b] = x.transpose(0, 1)
    return out


def _dense_mask(positions: torch.Tensor) -> torch.Tensor:
    doc = (positions == 0).cumsum(-1)
    causal = torch.ones(positions.shape[1], positions.shape[1], dtype=torch.bool).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


@pytest.mark.parametrize("names", [{"is_causal", "enable_gqa", "scale"}, {"window_size"}])
def test_varlen_layout_attends_as_the_block_diagonal_mask(monkeypatch, names):
    """Our flattening, grouped keys (by the kernel or repeated), the scale (passed or folded into the query) and
    the output's layout: the same output and gradients as SDPA with the mask transformers builds."""
    import torch.nn.attention.varlen as varlen

    monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen)
    monkeypatch.setattr(attention, "_varlen_names", frozenset(names | {"query"}))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 8, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 8, 16, generator=g, requires_grad=True) for _ in range(2))
    scale = 0.3
    out = attention.varlen_attention(q, k, v, documents_of(PACKED, 7), scale)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=_dense_mask(PACKED), scale=scale, enable_gqa=True)
    assert out.shape == (2, 8, 8, 16)  # (B, S, H, D)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)
    w = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    refs = torch.autograd.grad((ref.transpose(1, 2) * w).sum(), (q, k, v))
    for a, b in zip(grads, refs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _packed_loss(model, ids, positions, documents, compiled: bool = False):
    from tunebench.engine.model import CausalLMWithLoss

    model.zero_grad()
    module = CausalLMWithLoss(model, 1024)
    loss = (torch.compile(module) if compiled else module)(ids, ids, positions, documents)
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])


def _tiny(precision: str, device: str):
    from tunebench.models import build_model, resolve_model

    model, _ = build_model(resolve_model("tiny-llama"), RunConfig(precision=precision, device=device, dropout=0.0),
                           torch.device(device))
    return model


def test_where_the_kernel_cannot_run_the_mask_keeps_examples_apart():
    """On the CPU (and in fp32) the examples' bounds are ignored: the mask transformers builds decides, as before."""
    model = _tiny("fp32", "cpu")
    ids = torch.randint(0, 1024, PACKED.shape, generator=torch.Generator().manual_seed(0))
    with_bounds = _packed_loss(model, ids, PACKED, documents_of(PACKED, 6))
    without = _packed_loss(model, ids, PACKED, None)
    assert torch.equal(with_bounds[0], without[0]) and torch.equal(with_bounds[1], without[1])


@GPU
@pytest.mark.parametrize("compiled", [False, True])
def test_packed_rows_on_the_gpu_take_the_varlen_kernel_and_train_alike(compiled):
    """bf16 on a GPU: a tiny Llama (grouped keys) over packed rows, through varlen and through the mask: the same
    loss and gradients to bf16's precision; varlen's kernel is the one that ran."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = _tiny("bf16", "cuda").to(torch.bfloat16)
    b, s = 4, 512
    gen = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(b):
        pos: list[int] = []
        while len(pos) < s:
            n = int(torch.randint(16, 300, (1,), generator=gen))
            pos += list(range(min(n, s - len(pos))))
        rows.append(pos)
    positions = torch.tensor(rows).cuda()
    ids = torch.randint(0, 1024, (b, s), generator=gen).cuda()
    documents = documents_of(positions.cpu(), 64).cuda()
    _packed_loss(model, ids, positions, documents, compiled)  # compiled: traced before it is profiled
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        loss, grads = _packed_loss(model, ids, positions, documents, compiled)
    kernels = " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")
    # flash's kernels, not the memory-efficient one (cutlass) that SDPA takes with a mask
    assert "flash_fwd" in kernels and "flash_bwd" in kernels and "fmha_cutlass" not in kernels
    ref_loss, ref_grads = _packed_loss(model, ids, positions, None)
    assert abs(loss.item() - ref_loss.item()) < 0.02
    cos = F.cosine_similarity(grads, ref_grads, dim=0)
    assert cos > 0.99
