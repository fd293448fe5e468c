"""The fused chunked loss equals plain cross-entropy over full logits, in value and in every gradient."""

import pytest
import torch
import torch.nn.functional as F

from tunebench.engine import loss as L


def _reference(h, head, y):
    return F.cross_entropy(head(h).float().reshape(-1, head.out_features), y.reshape(-1))


@pytest.mark.parametrize("bias,frozen_head", [(False, False), (True, False), (False, True)])
def test_fused_matches_reference_fp32(monkeypatch, bias, frozen_head):
    monkeypatch.setattr(L, "LOGITS_PER_CHUNK", 97 * 50)  # chunks of 128 tokens, the last one partial
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 97, bias=bias)
    head.weight.requires_grad_(not frozen_head)
    h = torch.randn(3, 200, 32, requires_grad=True)  # a trained head: two groups of chunks, the last one partial
    y = torch.randint(0, 97, (3, 200))
    ref = _reference(h, head, y)
    ref_grads = torch.autograd.grad(ref * 3.0, [h] + [p for p in head.parameters() if p.requires_grad])
    out = L.causal_lm_loss(h, head, y, 97)
    grads = torch.autograd.grad(out * 3.0, [h] + [p for p in head.parameters() if p.requires_grad])
    assert L.chunk_tokens(97) * L.GRAD_GROUP < 600 and L.is_fusable(head)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_fused_under_bf16_autocast_is_close():
    torch.manual_seed(0)
    head = torch.nn.Linear(64, 300, bias=False)
    h = torch.randn(2, 50, 64, requires_grad=True)
    y = torch.randint(0, 300, (2, 50))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _reference(h, head, y)
        out = L.causal_lm_loss(h, head, y, 300)
    gr = torch.autograd.grad(ref, [h, head.weight])
    go = torch.autograd.grad(out, [h, head.weight])
    assert abs(out.item() - ref.item()) < 1e-2
    for a, b in zip(go, gr):
        assert (a - b).norm() / b.norm() < 2e-2
        assert a.dtype == b.dtype


def test_wrapped_head_falls_back_to_checkpointed_chunks():
    head = torch.nn.Sequential(torch.nn.Linear(16, 40))
    h = torch.randn(1, 30, 16, requires_grad=True)
    y = torch.randint(0, 40, (1, 30))
    ref = F.cross_entropy(head(h).reshape(-1, 40), y.reshape(-1))
    out = L.causal_lm_loss(h, head, y, 40)
    assert not L.is_fusable(head)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(torch.autograd.grad(out, h)[0], torch.autograd.grad(ref, h)[0])


def test_masked_labels_match_cross_entropy_with_ignore_index():
    """Real data ignores prompt, padding and boundary labels (-100): the fused loss and its gradients agree."""
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 200, bias=True)
    h = torch.randn(3, 40, 32, requires_grad=True)
    y = torch.randint(0, 200, (3, 40))
    y[0, :10] = -100
    y[2, 30:] = -100
    ref = F.cross_entropy(head(h).reshape(-1, 200), y.reshape(-1), ignore_index=-100)
    out = L.causal_lm_loss(h, head, y, 200, masked=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(torch.autograd.grad(out, [h, head.weight, head.bias]),
                    torch.autograd.grad(ref, [h, head.weight, head.bias])):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    wrapped = torch.nn.Sequential(head)  # the checkpointed-chunks path ignores them too
    torch.testing.assert_close(L.causal_lm_loss(h, wrapped, y, 200, masked=True), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("masked,bias,autocast", [(False, False, False), (True, True, False), (True, False, True)])
def test_evaluation_computes_the_loss_alone(monkeypatch, masked, bias, autocast):
    """Without grad (evaluation) the loss is the same, chunk by chunk, and no gradient of the logits or the head is
    computed (the fused function would, whatever the grad mode)."""
    monkeypatch.setattr(L, "LOGITS_PER_CHUNK", 97 * 50)  # chunks of 128 tokens, the last one partial
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 97, bias=bias)
    h, y = torch.randn(3, 200, 32), torch.randint(0, 97, (3, 200))
    y[0, :30] = -100 if masked else y[0, :30]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ref = L.causal_lm_loss(h, head, y, 97, masked=masked)
        monkeypatch.setattr(L, "_loss_and_grad", None)  # called: TypeError
        with torch.no_grad():
            out = L.causal_lm_loss(h, head, y, 97, masked=masked)
    assert not out.requires_grad
    torch.testing.assert_close(out, ref.detach(), rtol=1e-5 if not autocast else 1e-3, atol=1e-5)


def test_odd_vocabularies_are_padded_for_aligned_matmuls():
    """GPT-2's 50,257 rows would give every matmul of the loss a stride no fast GPU kernel takes: the loss pads
    the head with zero rows to a multiple of 64, whose columns get no probability (the tests above use odd
    vocabularies: values and gradients equal the reference). An aligned head is used as it is, without a copy."""
    odd, aligned = torch.randn(97, 8), torch.randn(128, 8)
    padded = L._padded(odd)
    assert padded.shape == (128, 8) and torch.equal(padded[:97], odd) and not padded[97:].any()
    assert L._padded(aligned) is aligned



DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: "
                                                                "run on one, see benchmarks/results/full-finetune.md"))]


@pytest.mark.parametrize("device", DEVICES)
def test_head_gradient_accumulates_in_fp32(device):
    """Chunk by chunk the head's gradient goes into fp32: on CUDA straight from the matmul (no bf16 rounding of
    each chunk's product); elsewhere through a product in the inputs' dtype."""
    torch.manual_seed(0)
    acc = torch.randn(256, 128, device=device)
    a = torch.randn(256, 512, device=device, dtype=torch.bfloat16)
    b = torch.randn(512, 128, device=device, dtype=torch.bfloat16)
    want = acc + a.float() @ b.float()
    L._accumulate(acc, a, b)
    err = ((acc - want).norm() / want.norm()).item()
    assert acc.dtype == torch.float32
    assert err < (1e-5 if device == "cuda" else 5e-3), err


@pytest.mark.parametrize("device", DEVICES)
def test_fused_bf16_on_each_device_matches_fp32_reference(monkeypatch, device):
    """bf16 weights and hidden states (FSDP2's compute), several chunks: value and gradients near fp32's."""
    monkeypatch.setattr(L, "LOGITS_PER_CHUNK", 1000 * 64)
    torch.manual_seed(0)
    head = torch.nn.Linear(128, 1000, bias=False, device=device)
    h = torch.randn(4, 96, 128, device=device, requires_grad=True)
    y = torch.randint(0, 1000, (4, 96), device=device)
    ref = _reference(h, head, y)
    gr = torch.autograd.grad(ref, [h, head.weight])
    hb, wb = h.detach().bfloat16().requires_grad_(), head.weight.detach().bfloat16().requires_grad_()
    bf16_head = torch.nn.Linear(128, 1000, bias=False, device=device, dtype=torch.bfloat16)
    bf16_head.weight = torch.nn.Parameter(wb)
    out = L.causal_lm_loss(hb, bf16_head, y, 1000)
    go = torch.autograd.grad(out, [hb, bf16_head.weight])
    assert L.chunk_tokens(1000) * 2 < 4 * 96  # several chunks
    assert abs(out.item() - ref.item()) < 2e-2
    for a, b in zip(go, gr):
        assert a.dtype == torch.bfloat16
        assert ((a.float() - b).norm() / b.norm()).item() < 2e-2


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_compiled_softmax_gradient_matches_the_in_place_one(padded, masked):
    """A chunk's loss and logit gradient as one compiled pair of kernels (the GPU's path) against the in-place
    eager form: bf16 logits, the padding's columns excluded, ignored tokens zeroed; compiled here on the CPU."""
    torch.manual_seed(0)
    vocab, width = 1000, 1024 if padded else 1000
    logits = (torch.randn(64, width) * 4).bfloat16()
    y = torch.randint(0, vocab, (64,))
    valid = (torch.rand(64) > 0.3) if masked else None
    for rows in (64, 40):  # a full chunk and a partial last one: the rows dimension marked dynamic, as on GPUs
        part = logits[:rows]
        v = None if valid is None else valid[:rows]
        want_loss, want_grad = L._loss_and_grad_eager(part, y[:rows], vocab, v, torch.bfloat16)
        torch._dynamo.maybe_mark_dynamic(part, 0)
        loss, grad = L._compiled()(part, y[:rows], vocab, v, torch.bfloat16)
        assert grad.dtype == torch.bfloat16 and grad.shape == part.shape
        torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(grad.float(), want_grad.float(), rtol=1e-2, atol=1e-3)
        if padded:
            assert not grad[:, vocab:].any()
        if masked:
            assert not grad[~v].any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab", [1000, 1024])  # padded to a multiple of 64, and not
@pytest.mark.parametrize("masked", [False, True])
def test_fused_loss_traced_in_a_graph_equals_eager(monkeypatch, device, vocab, masked, request):
    """The fused loss inside a compiled graph (a whole model's: its forward traced by dynamo, its ops in the graph)
    gives the eager value and gradients: of the hidden states, and of the trained head, accumulated in groups. On
    the CPU one case runs inductor's code, the others the graph as traced and partitioned (no_codegen)."""
    if device == "cpu" and not (masked and vocab == 1000):
        request.getfixturevalue("no_codegen")
    monkeypatch.setattr(L, "LOGITS_PER_CHUNK", vocab * 64)  # several chunks and groups, the last ones partial
    torch.manual_seed(0)
    head = torch.nn.Linear(128, vocab, bias=False, device=device)
    h = torch.randn(3, 150, 128, device=device, requires_grad=True)
    y = torch.randint(0, vocab, (3, 150), device=device)
    if masked:
        y[torch.rand(3, 150, device=device) < 0.3] = L.IGNORE

    def loss(h, y):
        return L.causal_lm_loss(h * 1.0, head, y, vocab, masked=masked)

    want = loss(h, y)
    want_grads = torch.autograd.grad(want, [h, head.weight])
    torch._dynamo.reset()
    got = torch.compile(loss, fullgraph=True)(h, y)
    got_grads = torch.autograd.grad(got, [h, head.weight])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: run on one, see benchmarks/results/full-finetune.md")
def test_traced_loss_accumulates_the_head_gradient_in_place(monkeypatch):
    """In a compiled graph the head's gradient goes into one fp32 accumulator group by group, as eagerly: no group's
    16-bit product waits for a sum at the loss's end. Eight groups of small chunks before a large head: summed out of
    place, the graph held several 64 MiB products at once; in place, it peaks within one product of the eager loss."""
    monkeypatch.setattr(L, "LOGITS_PER_CHUNK", 8192 * 64)  # 64-row chunks, 192-row groups: 8 groups below
    torch.manual_seed(0)
    head = torch.nn.Linear(4096, 8192, bias=False, device="cuda")
    h = torch.randn(8, 192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, 8192, (8, 192), device="cuda")

    def loss(h, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return L.causal_lm_loss(h * 1.0, head, y, 8192)

    def peak(fn) -> tuple[int, torch.Tensor]:
        for _ in range(2):  # the second call: compiled, without the compile's own allocations
            head.weight.grad = h.grad = None
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn(h, y).backward()
            torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, head.weight.grad.clone()

    eager, want = peak(loss)
    torch._dynamo.reset()
    traced, got = peak(torch.compile(loss, fullgraph=True))
    product = 8192 * 4096 * 2
    assert traced < eager + product, (traced / 2**20, eager / 2**20)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
