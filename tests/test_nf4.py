"""4-bit linears dequantized in torch ops (models.nf4): bitsandbytes' values, its gradients, one traced graph."""

import types

import pytest
import torch

from tunebench.models import nf4, nf4_kernel

bnb = pytest.importorskip("bitsandbytes")
BF = pytest.importorskip("bitsandbytes.functional")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: "
                                                                "run on one, see benchmarks/results/qlora-lora.md"))]


def _quantized(shape, quant_type="nf4", nested=True, device="cpu", seed=0):
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device)
    packed, qs = BF.quantize_4bit(w, blocksize=64, quant_type=quant_type, compress_statistics=nested)
    return w, packed, qs


def _ours(packed, qs, dtype=torch.float32):
    nested = (qs.state2.code, qs.state2.absmax, qs.offset) if qs.nested else (None, None, None)
    return nf4.dequantize(packed, qs.absmax, qs.code, qs.blocksize, tuple(qs.shape), dtype, *nested)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
def test_dequantize_equals_bitsandbytes(device, quant_type, nested):
    for shape in ((176, 64), (384, 1024)):  # rows of whole 64-element blocks; nested absmax partial and whole
        _, packed, qs = _quantized(shape, quant_type, nested, device)
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(_ours(packed, qs, dtype), BF.dequantize_4bit(packed, qs).to(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_blocks_across_rows_dequantize_as_quantized(device):
    """Rows of 176 elements: blocks of 64 straddle rows. The flat layout is what quantize_4bit wrote (ours
    quantizes back to the same bytes); bitsandbytes 0.50's CPU kernel reads it per row (wrongly, there), its
    CUDA kernel agrees with ours."""
    w, packed, qs = _quantized((64, 176), nested=False, device=device)
    ours = _ours(packed, qs)
    again, qs2 = BF.quantize_4bit(ours, blocksize=64, quant_type="nf4", compress_statistics=False)
    assert torch.equal(again, packed) and torch.equal(qs2.absmax, qs.absmax)
    assert (ours - w).abs().max() <= qs.absmax.max()  # within one block's scale of the original
    if device == "cuda":
        assert torch.equal(ours, BF.dequantize_4bit(packed, qs))


CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available() or not nf4_kernel.available(torch.zeros(1).cuda()),
                               reason="the Triton kernel needs a GPU: run on one, see benchmarks/results/qlora-lora.md")


@CUDA_ONLY
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("blocksize", [64, 128])
def test_kernel_equals_bitsandbytes(quant_type, nested, blocksize):
    """models.nf4_kernel: bitsandbytes' values bit for bit, in every output dtype, for sizes that end inside a
    program (4,096 values each), a nested-absmax block (256 absmax), or a quantization block's row."""
    for shape in ((176, 64), (3, 320), (384, 1024), (1000, 4096), (4096, 1408)):
        w = torch.randn(shape, generator=torch.Generator().manual_seed(1)).cuda()
        packed, qs = BF.quantize_4bit(w, blocksize=blocksize, quant_type=quant_type, compress_statistics=nested)
        nest = (qs.state2.code, qs.state2.absmax, qs.offset) if qs.nested else (None, None, None)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            ref = BF.dequantize_4bit(packed, qs).float().to(dtype)
            for again in (False, True):
                ours = nf4_kernel.dequantize(packed, qs.absmax, qs.code, qs.blocksize, tuple(qs.shape), dtype, *nest,
                                             again=again)
                assert ours.dtype == dtype and torch.equal(ours, ref), (shape, dtype, again)


@CUDA_ONLY
def test_kernel_traces_into_a_compiled_graph_and_switches_off():
    """torch.compile sees the kernel as an op (one graph, no break); TUNEBENCH_NF4_KERNEL=0 goes back to the
    torch ops."""
    from torch._dynamo.utils import counters

    _, packed, qs = _quantized((256, 512), device="cuda")
    args = (packed, qs.absmax, qs.code, qs.blocksize, tuple(qs.shape), torch.bfloat16, qs.state2.code,
            qs.state2.absmax, qs.offset)
    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(nf4_kernel.dequantize, fullgraph=True)(*args)
    assert torch.equal(out, BF.dequantize_4bit(packed, qs).to(torch.bfloat16))
    assert not counters["graph_break"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEBENCH_NF4_KERNEL", "0")
        assert not nf4_kernel.available(packed)


def _layer(device="cpu", bias=False):
    lin = bnb.nn.Linear4bit(256, 192, bias=bias, compute_dtype=torch.float32, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(torch.randn(192, 256) / 16, requires_grad=False, quant_type="nf4",
                                   compress_statistics=True)
    if bias:
        lin.bias = torch.nn.Parameter(torch.randn(192))
    return lin.to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_layer_matches_bitsandbytes_and_keeps_no_weight_for_backward(device):
    lin = _layer(device, bias=True)
    x = torch.randn(3, 5, 256, device=device, requires_grad=True)
    ref = lin(x)
    ref_grads = torch.autograd.grad(ref.square().sum(), [x, lin.bias])
    assert nf4.fuse_dequantization(lin) == 1 and nf4.fusable(lin)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = lin(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(torch.autograd.grad(out.square().sum(), [x, lin.bias]), ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
    # what backward keeps: the packed weight and its scales, never a dequantized (192 x 256) copy
    assert not [t for t in saved if t.is_floating_point() and t.numel() >= 192 * 256]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("float8", [False, True])
def test_compiled_layers_keep_no_dequantized_weight_for_backward(device, float8):
    """Compiled, the forward's and backward's dequantizations are not merged into one kept for backward (what the
    joint graph's common-subexpression pass did: +13 GiB on Mistral-7B): backward keeps only the packed weights.
    On a GPU the dequantization is the Triton kernel (models.nf4_kernel), seen by the compiler as an op. float8
    (models.float8_frozen): neither a bf16 nor a float8 copy of a weight kept."""
    a, b = _layer(), _layer()
    b.weight = bnb.nn.Params4bit(torch.randn(256, 192) / 16, requires_grad=False, quant_type="nf4",
                                 compress_statistics=True)
    a, b = a.to(device), b.to(device)
    block = torch.nn.Sequential(a, torch.nn.SiLU(), b)
    x = torch.randn(64, 256, device=device, requires_grad=True)
    ref = torch.autograd.grad(block(x).square().sum(), x)[0]
    assert nf4.fuse_dequantization(block, float8=float8) == 2
    block.compile()
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = block(x)
    grad = torch.autograd.grad(out.square().sum(), x)[0]
    if float8:
        assert float((grad - ref).norm() / ref.norm()) < 0.1
    else:
        torch.testing.assert_close(grad, ref, rtol=1e-4, atol=1e-4)
    floats = [tuple(t.shape) for t in saved if t.is_floating_point() and t.numel() >= 192 * 256]
    assert floats == [], f"dequantized weights kept for backward: {floats}"


def test_compiled_blocks_are_fused_unless_checkpointed_around_and_trace_as_one_graph():
    """Compiled QLoRA blocks whose checkpoint is traced (keeping their matmuls, so that the policy sees the base
    matmuls; or recomputed whole, as plain ops) or that are not checkpointed get our dequantization; dynamo captures
    such a block whole. Blocks under Hugging Face's checkpoint around their call keep bitsandbytes' layers."""
    from torch._dynamo.utils import counters

    from tunebench.config import RunConfig
    from tunebench.dist import SINGLE
    from tunebench.engine.model import transformer_blocks
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable

    def fused(keep: str, traced: bool = True) -> tuple[list[bool], object, object]:
        cfg = RunConfig(model="tiny-llama", method="qlora", seq_len=32, batch_size=1, device="cpu", compile=True,
                        grad_ckpt=True, ckpt_every=2, ckpt_keep=keep, ckpt_traced=traced)
        plan = preflight(cfg)
        trained = build_trainable(plan, Outcome(), SINGLE)
        blocks = transformer_blocks(trained.model, plan.spec.num_layers)
        return [all(isinstance(m.forward, types.MethodType) and m.forward.__func__ is nf4._forward
                    for m in b.modules() if isinstance(m, bnb.nn.Linear4bit)) for b in blocks], trained, plan

    assert fused("input", traced=False)[0] == [False, True]  # every second block checkpointed whole (ckpt_every 2)
    for keep in ("input", "matmuls"):
        flags, trained, plan = fused(keep)
        assert flags == [True, True]
        block = transformer_blocks(trained.model, plan.spec.num_layers)[0]
        recomputed = [m.recomputed for m in block.modules() if isinstance(m, bnb.nn.Linear4bit)]
        assert recomputed == [keep == "input"] * 7  # plain ops where the whole block is recomputed
        h = torch.randn(1, 32, plan.spec.hidden_size, requires_grad=True)
        pos = torch.arange(32)[None]
        rotary = trained.model.base_model.model.model.rotary_emb(h, pos)
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(block.forward, backend="eager")  # tracing only: no kernels generated on the CPU
        compiled(h, position_embeddings=rotary, position_ids=pos)
        assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1


def _float8(packed, qs, again=False):
    """The weight in e4m3 and the factor per row that undoes its scale, as a float8 layer computes them."""
    nested = (qs.state2.code, qs.state2.absmax, qs.offset) if qs.nested else (None, None, None)
    args = (packed, qs.absmax, qs.code, *nested, qs.blocksize, tuple(qs.shape))
    scale = nf4.float8_row_scales(*args)
    return nf4.float8_weight(*args, scale, again), scale.reciprocal()[:, None]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
def test_float8_weight_straight_from_4_bits(device, quant_type, nested):
    """The 4-bit weight to e4m3 in one pass (the Triton kernel on a GPU): the very bytes of the weight dequantized
    and cast row by row (the scale from the absmax alone is the row's own), by both entry points; and the input's
    gradient from them (row factors moved onto dy) within float8's rounding of dy W."""
    from tunebench.models import float8_frozen

    for shape in ((384, 1024), (208, 4096), (64, 176)):  # the last: blocks cross rows (scales from the weight)
        _, packed, qs = _quantized(shape, quant_type, nested, device)
        w = _ours(packed, qs)
        ref8, ref_inv = float8_frozen.rowwise(w)
        for again in (False, True):
            w8, inv = _float8(packed, qs, again)
            assert w8.shape == shape
            torch.testing.assert_close(inv, ref_inv, rtol=0, atol=0)
            differ = w8.view(torch.uint8) != ref8.view(torch.uint8)
            assert not differ.any(), (f"{int(differ.sum())} of {differ.numel()} bytes differ, e.g. "
                                      f"{w8[differ][:4].float().tolist()} against {ref8[differ][:4].float().tolist()}")
        grad = torch.randn(64, shape[0], device=device, dtype=torch.bfloat16)
        dx = float8_frozen.input_grad_of_rows(grad, w8, inv)
        exact = grad.float() @ w
        assert dx.dtype == torch.bfloat16 and float((dx.float() - exact).norm() / exact.norm()) < 0.06


def test_float8_kernel_in_tritons_interpreter_places_every_value():
    """The float8 kernel run by Triton's interpreter on the CPU (where Triton is installed) into an fp32 buffer:
    every value scaled and placed as the torch ops place it (and the bf16 kernel's, which shares its pieces). The
    interpreter's own cast to e4m3 rounds unlike the GPU's (124 -> 64), so the cast is left to the GPU test above."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    code = """
import torch, triton, bitsandbytes.functional as BF
from tunebench.models import nf4, nf4_kernel as K
for rows, cols in ((200, 1024), (64, 4096), (130, 192)):  # programs cut at the end too
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))
    for nested in (False, True):
        packed, qs = BF.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=nested)
        nest = (qs.state2.code, qs.state2.absmax, qs.offset) if nested else (qs.code, qs.code, qs.code)
        deq = nf4.dequantize(packed, qs.absmax, qs.code, 64, (rows, cols), torch.float32,
                             *(nest if nested else (None, None, None)))
        scale = nf4.float8_row_scales(packed, qs.absmax, qs.code, *(nest if nested else (None, None, None)), 64,
                                      (rows, cols))
        out = torch.full((rows * cols,), float("nan"))
        K._to_float8_rows_kernel[(triton.cdiv(rows * cols // 2, 2048),)](
            packed.reshape(-1), qs.absmax, qs.code, *nest, scale, out, rows * cols // 2, ROW_BYTES=cols // 2,
            HALF_BLOCK=32, NESTED_BLOCK=256, NESTED=nested, BYTES=2048)
        assert torch.equal(out, (deq * scale[:, None]).reshape(-1).clamp(-448, 448)), (rows, cols, nested)
        out.fill_(float("nan"))  # the bf16 kernel's values, into fp32 too: the same block scales and places
        K._dequantize_kernel[(triton.cdiv(rows * cols // 2, 2048),)](
            packed.reshape(-1), qs.absmax, qs.code, *nest, out, rows * cols // 2, HALF_BLOCK=32, NESTED_BLOCK=256,
            NESTED=nested, BYTES=2048)
        assert torch.equal(out, deq.reshape(-1)), (rows, cols, nested, "dequantize")
print("placed")
"""
    env = os.environ | {"TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and "placed" in p.stdout, p.stderr[-3000:]
