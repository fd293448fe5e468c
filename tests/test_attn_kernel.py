"""SDPA's kernel order (`attn_kernel`, engine.step.attention_kernels): cuDNN's first when asked, values as
flash's, compile's caches told apart, and a checkpoint's recompute picking what the forward picked."""

import pytest
import torch

from tunebench.config import RunConfig
from tunebench.engine.step import attention_kernels

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
ON_HOPPER = pytest.mark.skipif(not HOPPER, reason="cuDNN's SDPA measured on Hopper GPUs: run on one, see "
                                                  "benchmarks/results/qlora-lora.md")


def test_default_leaves_stored_configs_alone_and_the_cpu_untouched():
    assert RunConfig().attn_kernel == "auto"
    assert RunConfig().config_hash() == RunConfig(attn_kernel="auto").config_hash()
    assert RunConfig().config_hash() != RunConfig(attn_kernel="flash").config_hash()
    for kernel in ("auto", "cudnn", "flash"):  # the CPU's SDPA has no such choice
        with attention_kernels(RunConfig(attn_kernel=kernel), torch.device("cpu")):
            assert torch.compiler.config.cache_key_tag == ""
    with pytest.raises(ValueError):
        RunConfig(attn_kernel="fast")


def _kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@ON_HOPPER
@pytest.mark.parametrize("shape", [(2, 12, 1024, 64), (2, 32, 512, 128), "gqa"])
def test_cudnn_first_on_hopper_matches_flash(shape):
    """attn_kernel=cudnn runs cuDNN's kernel on Hopper; its output and gradients agree with flash's to bf16's
    precision."""
    gqa = shape == "gqa"
    q_shape, kv_shape = ((2, 32, 512, 128), (2, 8, 512, 128)) if gqa else (shape, shape)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(q_shape, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
    k, v = (torch.randn(kv_shape, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
            for _ in range(2))
    grad = torch.randn(q_shape, device="cuda", dtype=torch.bfloat16, generator=g)

    def attend(kernel: str):
        with attention_kernels(RunConfig(attn_kernel=kernel), torch.device("cuda")):
            # compile's caches told apart (their keys do not see the order)
            assert torch.compiler.config.cache_key_tag == f"sdpa-{kernel}-first"
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return out, torch.autograd.grad(out, (q, k, v), grad)

    names = _kernel_names(lambda: attend("cudnn"))
    if not gqa:
        assert any("cudnn" in n.lower() for n in names), names
    (out, grads), (ref, ref_grads) = attend("cudnn"), attend("flash")
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


@ON_HOPPER
@pytest.mark.parametrize("compile_", [False, True])
def test_checkpointed_runs_agree_across_kernels(compile_):
    """Checkpointed blocks recompute under the kernel the forward used (the loop holds the order): a run with
    cuDNN's kernel first finishes and its losses follow PyTorch's default (flash)."""
    from tunebench import run

    losses = {}
    for kernel in ("cudnn", "auto"):
        rec = run(RunConfig(model="tiny-llama", seq_len=256, batch_size=4, steps=6, warmup=1, grad_ckpt=True,
                            compile=compile_, attn_kernel=kernel, device="cuda", tag=["test-attn-kernel"]))
        assert rec.status == "ok", rec.error
        losses[kernel] = (rec.metrics.loss_first, rec.metrics.loss_last)
    torch.testing.assert_close(losses["cudnn"], losses["auto"], atol=2e-2, rtol=1e-2)
