"""float8: rowwise for LoRA/QLoRA: a frozen base's two products in float8 (models.float8_frozen) against bf16's."""

import pytest
import torch

from tunebench import RunConfig, run
from tunebench.dist import SINGLE
from tunebench.models import float8_frozen
from tunebench.run_preflight import preflight
from tunebench.runner import Outcome, build_trainable

BASE = dict(model="tiny-llama", steps=6, warmup=1, seq_len=32, batch_size=2, lr=3e-3, device="cpu",
            telemetry=False)
CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                     reason="no GPU: run on one, see benchmarks/results/qlora-lora.md"))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_products_and_input_gradient_within_float8s_rounding(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 16, 128, dtype=dtype, requires_grad=True)
    w = (torch.randn(96, 128) * 0.02).to(dtype)
    grad = torch.randn(3, 16, 96, dtype=dtype)
    y = float8_frozen.linear(x, w)
    y.backward(grad)
    xr = x.detach().clone().requires_grad_()
    yr = torch.nn.functional.linear(xr, w)
    yr.backward(grad)
    assert y.dtype == dtype and x.grad.dtype == dtype
    # e4m3 keeps 3 mantissa bits: a product of two rounded operands is off by a few percent, never more
    assert 0 < _rel(y, yr) < 0.06 and 0 < _rel(x.grad, xr.grad) < 0.06


def test_a_row_of_zeros_stays_zero():
    x = torch.zeros(4, 64)
    x[1] = torch.randn(64)
    y = float8_frozen.linear(x, torch.randn(32, 64))
    assert torch.isfinite(y).all() and (y[0] == 0).all() and (y[2:] == 0).all()


def test_scales_undo_the_quantization():
    t = torch.randn(8, 256) * torch.logspace(-3, 3, 8)[:, None]  # rows six orders of magnitude apart
    t8, inv = float8_frozen.rowwise(t)
    assert t8.dtype == torch.float8_e4m3fn and inv.shape == (8, 1)
    assert _rel(t8.float() * inv, t) < 0.04
    tt8, inv_t = float8_frozen.columnwise_transposed(t)
    assert tt8.shape == (256, 8) and tt8.is_contiguous() and inv_t.shape == (256, 1)
    assert _rel((tt8.float() * inv_t).t(), t) < 0.04


@pytest.mark.parametrize("device", [CUDA])
def test_scaled_mm_computes_what_the_reference_computes(device):
    """The GPU's float8 matmul against the same float8 values multiplied in fp32 (forward and backward)."""
    torch.manual_seed(0)
    x = torch.randn(256, 512, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(384, 512, device=device, dtype=torch.bfloat16) * 0.02
    grad = torch.randn(256, 384, device=device, dtype=torch.bfloat16)
    outs = []
    for emulated in (False, True):
        x.grad = None
        y = float8_frozen.linear(x, w, emulated=emulated)
        y.backward(grad)
        outs.append((y, x.grad.clone()))
    assert _rel(outs[0][0], outs[1][0]) < 1e-2 and _rel(outs[0][1], outs[1][1]) < 1e-2


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_training_routes_the_base_through_float8_and_learns_as_bf16(method, monkeypatch):
    calls = []
    product = float8_frozen.product

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return product(*args, **kwargs)
    monkeypatch.setattr(float8_frozen, "product", counted)
    plain = run(RunConfig(**BASE, method=method))
    assert not calls
    f8 = run(RunConfig(**BASE, method=method, float8="rowwise"))
    assert plain.status == f8.status == "ok", f8.error
    # tiny-llama: 2 blocks x 7 linears, 6 steps, forward and backward; backward needs no input gradient for the
    # first block's q, k and v (their input comes from the frozen embeddings only)
    assert len(calls) == 2 * (2 * 7 * 6) - 3 * 6
    assert f8.metrics.losses == pytest.approx(plain.metrics.losses, rel=1e-2)
    assert f8.metrics.losses != plain.metrics.losses  # the rounding is float8's: not silently bf16


@pytest.mark.parametrize("base", ["bf16", "4-bit"])
def test_recomputed_product_computes_what_the_autograd_functions_compute(base):
    """The traced checkpoint's form of the product (one custom op with its own gradient) against the autograd
    functions' form: the same float8 values, so the same output and input gradient, bit for bit."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    w = (torch.randn(48, 64) * 0.02).to(torch.bfloat16)
    grad = torch.randn(2, 8, 48, dtype=torch.bfloat16)
    w8, w_inv = float8_frozen.rowwise(w)
    xb = x.clone().requires_grad_()
    if base == "bf16":  # a LoRA base (_FrozenLinear): backward casts W per column
        xa = x.clone().requires_grad_()
        ya = float8_frozen.linear(xa, w)
        ya.backward(grad)
        ref = (ya, xa.grad)
        yb = float8_frozen.linear(xb, w, recomputed=True)
    else:  # a 4-bit base (nf4._Linear4bit): W given in float8 per row, its row factors moved onto dy backward
        ref = (float8_frozen.product(x, w8, w_inv), float8_frozen.input_grad_of_rows(grad, w8, w_inv))
        yb = float8_frozen.recomputed_product(xb, w8, w_inv)
    yb.backward(grad)
    assert torch.equal(yb, ref[0]) and torch.equal(xb.grad, ref[1])
    assert _rel(yb, torch.nn.functional.linear(x, w)) < 0.06


@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_traced_float8_blocks_keep_only_their_input(device, method):
    """Compiled blocks recomputed whole keep what they keep in bf16 (their input), float8 or not: a float8 base's
    products are recomputed_product there, which the traced checkpoint marks for recompute. (With the autograd
    functions, torch 2.11's partitioner kept what they return: 15.8 GiB against 6.9 on Mistral-7B QLoRA, H200.)"""
    from test_recompute import _saved_activations
    from tunebench.engine.model import transformer_blocks
    from tunebench.engine.recompute import recomputes_traced

    saved = {}
    for float8 in ("off", "rowwise"):
        plan = preflight(RunConfig(**BASE | dict(device=device, precision="bf16" if device == "cpu" else "auto"),
                                   method=method, grad_ckpt=True, compile=True, float8=float8))
        t = build_trainable(plan, Outcome(), SINGLE)
        blocks = transformer_blocks(t.model, plan.spec.num_layers)
        assert all(recomputes_traced(b) for b in blocks)
        layers = [m for b in blocks for m in b.modules() if hasattr(m, "recomputed")]  # ours, float8 or 4-bit
        assert all(m.recomputed for m in layers) and len(layers) == (7 * len(blocks) if float8 != "off"
                                                                     or method == "qlora" else 0)
        # what is kept, where it showed: torch 2.11 (the GPU image's; on its CPU build too), not the CPU's 2.13
        for _ in range(2 if device == "cuda" or torch.__version__ < (2, 13) else 0):  # the second after compiling
            saved[float8] = _saved_activations(plan, t)
    assert saved.get("rowwise") == saved.get("off")


@pytest.mark.parametrize("args,message", [
    (["--method", "lora", "--float8", "tensorwise"], "float8=tensorwise with method=lora"),
    (["--method", "qlora", "--float8", "rowwise", "--strategy", "fsdp", "--nproc-per-node", "2"],
     "float8=rowwise with method=qlora and strategy=fsdp"),
    (["--method", "lora", "--float8", "rowwise", "--grad-ckpt", "--compile", "--compile-scope", "model"],
     "with grad_ckpt and compile_scope=model"),
    (["--method", "lora", "--float8", "rowwise", "--model", "tinygpt-124m"], "GPT-2's are Conv1D"),
])
def test_refused_where_a_frozen_base_cannot_compute_in_float8(tb, args, message):
    code, _, err = tb("run", "--model", "tiny-llama", "--device", "cpu", *args, "--no-store")
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_head_stays_out_even_when_adapted():
    """lm_head as a LoRA target: its base is frozen, yet the logits are not computed in float8."""
    from tunebench.engine.model import transformer_blocks, unwrap

    plan = preflight(RunConfig(**BASE, method="lora", float8="rowwise", lora_targets=["q_proj", "lm_head"]))
    t = build_trainable(plan, Outcome(), SINGLE)
    head = unwrap(t.model).get_output_embeddings()
    routed = [m for m in t.model.modules() if isinstance(m, torch.nn.Linear) and "forward" in vars(m)]
    blocks = transformer_blocks(t.model, plan.spec.num_layers)
    assert len(routed) == len(blocks) and all(m is not getattr(head, "base_layer", head) for m in routed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: run on one, see benchmarks/results/qlora-lora.md")
def test_refused_on_a_gpu_unless_the_products_are_bf16(tb):
    code, _, err = tb("run", "--model", "tiny-llama", "--method", "lora", "--float8", "rowwise", "--precision",
                      "fp16", "--no-store")
    assert code == 2 and "written in bf16" in err
