"""Which kernels win on Mistral-7B's shapes: eager PyTorch, torch.compile's generated fusion, Liger's Triton kernels.

Each op is timed forward + backward on the training shapes (batch x seq tokens, default 8 x 512), its inputs
requiring gradients as in LoRA training (the frozen weights not), median of CUDA-event-timed repetitions:

- `rmsnorm`: Hugging Face's MistralRMSNorm (eager, compiled) vs Liger's RMSNorm;
- `swiglu`: silu(gate) * up (eager, compiled) vs Liger's SiLUMul;
- `rope`: Hugging Face's apply_rotary_pos_emb on q and k (eager, compiled) vs Liger's rope;
- `loss`: the head's matmul and cross-entropy, frozen head: Hugging Face's (logits, fp32, F.cross_entropy;
  eager, compiled), tunebench's fused chunked loss (engine.loss), Liger's fused linear cross-entropy;
- `attention`, `attention_gpt2`: causal SDPA by each backend (flash, memory-efficient, cuDNN) on Mistral-7B's
  shapes and on GPT-2 small's (s2048 b8, with and without its attention dropout);
- `base_fp8`: a frozen base's seven linears of one Mistral block (q, k, v, o, gate, up, down), the forward's
  product and the input's gradient (what LoRA/QLoRA compute with them): bf16 matmuls against float8 (e4m3) ones
  with rowwise scales (`torch._scaled_mm`), each side one compiled function, the activations and gradients
  quantized inside the timing, the weights beforehand (as a dequantization kernel could write them once a step);
- `nf4_float8`: one 4-bit weight (14336 x 4096) dequantized to bf16, and to float8 by models.nf4_kernel, and the
  float8 weight transposed;
- `layers`: `--layers` Mistral decoder layers with LoRA r16 on every linear (peft), forward + backward of the
  stack: eager, compiled per block (as tunebench runs), Liger's kernels patched in (eager, and compiled per block);
  and under bf16 autocast with fp32 adapters (as tunebench trains), compiled, the LoRA siblings (q/k/v, gate/up)
  apart as peft runs them and as one (`methods.lora_siblings`).

    python benchmarks/compare/kernels_vs.py [--ops rmsnorm,swiglu,rope,loss,layers,attention,attention_gpt2]
        [--tokens 4096] [--out F]

Runs on the CPU too (no Liger there, few repetitions: a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 8, 128, 32000


def timed(fn: Callable[[], object], reps: int, warmup: int) -> float:
    """Median milliseconds of `fn` (forward and backward)."""
    for _ in range(warmup):
        fn()
    times = []
    cuda = torch.cuda.is_available()
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _liger():
    try:
        import liger_kernel.transformers as lk  # noqa: F401
        return torch.cuda.is_available()
    except ImportError:
        return False


def _fwd_bwd(f: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> Callable[[], object]:
    grads = [torch.randn_like(f(*inputs))]

    def step():
        out = f(*inputs)
        out.backward(grads[0])
    return step


def op_rmsnorm(a, dev, dt) -> dict[str, Callable]:
    from transformers.models.mistral.modeling_mistral import MistralRMSNorm

    x = torch.randn(a.tokens, HIDDEN, device=dev, dtype=dt, requires_grad=True)
    norm = MistralRMSNorm(HIDDEN).to(dev, dt).requires_grad_(False)
    out = {"eager": _fwd_bwd(norm, x), "compiled": _fwd_bwd(torch.compile(norm), x)}
    if _liger():
        from liger_kernel.transformers.rms_norm import LigerRMSNorm

        lnorm = LigerRMSNorm(HIDDEN).to(dev, dt).requires_grad_(False)
        out["liger"] = _fwd_bwd(lnorm, x)
    return out


def op_swiglu(a, dev, dt) -> dict[str, Callable]:
    gate, up = (torch.randn(a.tokens, INTER, device=dev, dtype=dt, requires_grad=True) for _ in range(2))

    def swiglu(g, u):
        return torch.nn.functional.silu(g) * u
    out = {"eager": _fwd_bwd(swiglu, gate, up), "compiled": _fwd_bwd(torch.compile(swiglu), gate, up)}
    if _liger():
        from liger_kernel.transformers.functional import liger_swiglu

        out["liger"] = _fwd_bwd(liger_swiglu, gate, up)
    return out


def op_rope(a, dev, dt) -> dict[str, Callable]:
    from transformers.models.mistral.modeling_mistral import apply_rotary_pos_emb

    b, s = a.tokens // a.seq, a.seq
    q = torch.randn(b, HEADS, s, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(b, KV_HEADS, s, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
    angle = torch.arange(s, device=dev)[:, None] * torch.rand(HEAD_DIM // 2, device=dev)[None]
    angle = torch.cat((angle, angle), -1)[None].expand(b, -1, -1)
    cos, sin = angle.cos().to(dt), angle.sin().to(dt)

    def hf(q_, k_):
        qo, ko = apply_rotary_pos_emb(q_, k_, cos, sin)
        return torch.cat((qo.flatten(), ko.flatten()))
    out = {"eager": _fwd_bwd(hf, q, k), "compiled": _fwd_bwd(torch.compile(hf), q, k)}
    if _liger():
        from liger_kernel.transformers.functional import liger_rope

        def liger(q_, k_):
            qo, ko = liger_rope(q_, k_, cos, sin)
            return torch.cat((qo.flatten(), ko.flatten()))
        out["liger"] = _fwd_bwd(liger, q, k)
    return out


def op_loss(a, dev, dt) -> dict[str, Callable]:
    import torch.nn.functional as F

    from tunebench.engine.loss import causal_lm_loss

    h = torch.randn(a.tokens, HIDDEN, device=dev, dtype=dt, requires_grad=True)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(dev, dt).requires_grad_(False)
    labels = torch.randint(0, VOCAB, (a.tokens,), device=dev)

    def hf(h_):
        return F.cross_entropy(head(h_).float(), labels)
    out = {"eager": _fwd_bwd(hf, h), "compiled": _fwd_bwd(torch.compile(hf), h),
           "tunebench": _fwd_bwd(lambda h_: causal_lm_loss(h_, head, labels, VOCAB), h)}
    if _liger():
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        flce = LigerFusedLinearCrossEntropyLoss()
        out["liger"] = _fwd_bwd(lambda h_: flce(head.weight, h_, labels), h)
    return out


def op_layers(a, dev, dt) -> dict[str, Callable]:
    from peft import LoraConfig, get_peft_model
    from transformers import MistralConfig, MistralForCausalLM

    def stack(liger: bool, compiled: bool, siblings: bool | None = None) -> Callable:
        """`siblings` (under bf16 autocast, as tunebench trains): q/k/v and gate/up run as one
        (methods.lora_siblings) or apart as peft runs them; None: no autocast (peft's fp32 adapters on bf16)."""
        cfg = MistralConfig(hidden_size=HIDDEN if dev.type == "cuda" else 256,
                            intermediate_size=INTER if dev.type == "cuda" else 512, num_attention_heads=HEADS,
                            num_key_value_heads=KV_HEADS, num_hidden_layers=a.layers, vocab_size=256,
                            max_position_embeddings=a.seq, attn_implementation="sdpa")
        torch.manual_seed(0)
        model = MistralForCausalLM(cfg).to(dev, dt)
        if liger:
            from liger_kernel.transformers import apply_liger_kernel_to_mistral

            apply_liger_kernel_to_mistral(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=False,
                                          model=model)
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
        inner = model.base_model.model.model
        if siblings:
            from tunebench.methods.lora_siblings import group_siblings

            for layer in inner.layers:
                group_siblings(layer)
        if compiled:
            for layer in inner.layers:
                layer.compile()
        b = a.tokens // a.seq
        x = torch.randn(b, a.seq, cfg.hidden_size, device=dev, dtype=dt, requires_grad=True)
        pos = torch.arange(a.seq, device=dev)[None].expand(b, -1)
        rotary = inner.rotary_emb(x, pos)

        def run(x_):
            with torch.autocast(dev.type, torch.bfloat16, enabled=siblings is not None):
                for layer in inner.layers:
                    x_ = layer(x_, position_embeddings=rotary, position_ids=pos)
                    x_ = x_[0] if isinstance(x_, tuple) else x_
            return x_
        return _fwd_bwd(run, x)

    out = {"eager": stack(False, False), "compiled": stack(False, True),
           "autocast-apart-compiled": stack(False, True, siblings=False),
           "autocast-siblings-compiled": stack(False, True, siblings=True)}
    if _liger():
        out["liger"] = stack(True, False)
        out["liger-compiled"] = stack(True, True)
    return out


def _attention(shape: tuple[int, int, int, int], dropouts: tuple[float, ...], dev, dt) -> dict[str, Callable]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(shape, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    out = {}
    backends = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION)
    for backend in backends if dev.type == "cuda" else (SDPBackend.MATH,):
        for p in dropouts:
            def attend(q_, k_, v_, backend=backend, p=p):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(q_, k_, v_, is_causal=True, dropout_p=p)
            out[f"{backend.name.lower().replace('_attention', '')}" + (f" p{p}" if len(dropouts) > 1 else "")] = (
                _fwd_bwd(attend, q, k, v))
    return out


def op_attention(a, dev, dt) -> dict[str, Callable]:
    """Causal SDPA on Mistral-7B's shapes (32 heads of 128; k and v expanded to them, as transformers does)."""
    return _attention((a.tokens // a.seq, HEADS, a.seq, HEAD_DIM), (0.0,), dev, dt)


def op_attention_gpt2(a, dev, dt) -> dict[str, Callable]:
    """Causal SDPA on GPT-2 small's (s2048 b8: 12 heads of 64), without and with its 0.1 attention dropout."""
    return _attention((8, 12, 2048, 64) if dev.type == "cuda" else (1, 2, 128, 64), (0.0, 0.1), dev, dt)


def op_base_fp8(a, dev, dt) -> dict[str, Callable]:
    """One Mistral block's frozen linears, y = x Wᵀ and dx = dy W each: bf16 against float8 rowwise. Each side is
    one compiled function (no autograd, no Python between the matmuls), so that only the GPU's work differs."""
    shapes = [(HIDDEN, HIDDEN), (KV_HEADS * HEAD_DIM, HIDDEN), (KV_HEADS * HEAD_DIM, HIDDEN), (HIDDEN, HIDDEN),
              (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]
    if dev.type != "cuda":
        return {}  # float8 matmuls need a GPU with them (Hopper, Ada)
    weights = [torch.randn(o, i, device=dev, dtype=dt) * 0.02 for o, i in shapes]
    xs = [torch.randn(a.tokens, i, device=dev, dtype=dt) for _, i in shapes]
    dys = [torch.randn(a.tokens, o, device=dev, dtype=dt) for o, _ in shapes]
    from tunebench.models import float8_frozen as f8

    # the weights quantized beforehand, per output row (forward) and per input column stored (in, out) (backward)
    w8 = [(*f8.rowwise(w), *f8.columnwise_transposed(w)) for w in weights]

    @torch.compile
    def bf16():
        return [(x @ w.t(), dy @ w) for w, x, dy in zip(weights, xs, dys)]

    @torch.compile
    def fp8():
        return [(f8.product(x, wq, ws), f8.product(dy, wtq, wts)) for (wq, ws, wtq, wts), x, dy in zip(w8, xs, dys)]
    exact, approx = weights[0] @ xs[0][:256].t(), fp8()[0][0][:256].t()
    print(f"base_fp8: float8's relative error on q's output {float((approx - exact).norm() / exact.norm()):.4f}")
    return {"bf16": bf16, "float8-rowwise": fp8}


def op_nf4_float8(a, dev, dt) -> dict[str, Callable]:
    """Mistral-7B's up projection (14336 x 4096, NF4, nested) from 4 bits: to bf16 (what the bf16 path reads), to
    float8 per row (its constant row scales computed once, as a layer does), and that transposed (what backward
    multiplies)."""
    if dev.type != "cuda":
        return {}
    import bitsandbytes.functional as BF

    from tunebench.models import nf4, nf4_kernel

    packed, qs = BF.quantize_4bit(torch.randn(INTER, HIDDEN, device=dev, dtype=dt), blocksize=64, quant_type="nf4",
                                  compress_statistics=True)
    nest = (qs.state2.code, qs.state2.absmax, qs.offset)
    scale = nf4.float8_row_scales(packed, qs.absmax, qs.code, *nest, 64, (INTER, HIDDEN))  # once per layer
    w8 = nf4.float8_weight(packed, qs.absmax, qs.code, *nest, 64, (INTER, HIDDEN), scale)
    return {"bf16": lambda: nf4_kernel.dequantize(packed, qs.absmax, qs.code, 64, (INTER, HIDDEN), dt, *nest),
            "float8": lambda: nf4.float8_weight(packed, qs.absmax, qs.code, *nest, 64, (INTER, HIDDEN), scale),
            "float8 transposed": lambda: w8.t().contiguous()}


OPS = {"rmsnorm": op_rmsnorm, "swiglu": op_swiglu, "rope": op_rope, "loss": op_loss, "layers": op_layers,
       "attention": op_attention, "attention_gpt2": op_attention_gpt2, "base_fp8": op_base_fp8,
       "nf4_float8": op_nf4_float8}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--tokens", type=int, default=4096, help="batch x sequence (Mistral-7B s512 b8: 4096)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", help="write the figures as JSON here")
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = torch.bfloat16
    if dev.type == "cpu":  # a smoke test: small, few repetitions
        a.tokens, a.seq, a.reps = min(a.tokens, 256), min(a.seq, 128), 2
    results: dict[str, dict[str, float]] = {}
    for name in a.ops.split(","):
        variants = OPS[name](a, dev, dt)
        results[name] = {}
        if not variants:
            print(f"{name}: not run on {dev.type}")
            continue
        for v, step in variants.items():
            try:
                results[name][v] = timed(step, a.reps, warmup=3)
            except RuntimeError as e:  # a kernel that does not take these inputs (an SDPA backend)
                print(f"{name} {v}: not run: {str(e).splitlines()[0][:200]}")
        best = min(results[name], key=results[name].get)
        row = "  ".join(f"{v} {ms:.3f}" for v, ms in results[name].items())
        print(f"{name:<8} ms fwd+bwd: {row}   fastest: {best}", flush=True)
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(f"device {device}, {a.tokens} tokens" + (f", {a.layers} layers" if "layers" in results else ""))
    if a.out:
        Path(a.out).write_text(json.dumps({"device": device, "tokens": a.tokens, "layers": a.layers,
                                           "ms": results}, indent=2))


if __name__ == "__main__":
    main()
