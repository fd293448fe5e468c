"""tf32: fp32's matmuls on the tensor cores where asked (PyTorch's default is exact fp32), set for the run and
restored, refused where it cannot run, and planned at TF32's ceiling."""

import pytest
import torch
from pydantic import ValidationError

from tunebench import RunConfig, run
from tunebench.engine.step import kernel_settings, matmul_precision
from tunebench.gpus import gpu_named
from tunebench.plan import predict

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: run on one, see benchmarks/results/full-finetune.md")


def test_tf32_set_for_the_loop_and_restored():
    before = torch.get_float32_matmul_precision()
    with matmul_precision(RunConfig(precision="fp32", tf32=True)):
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32
    assert torch.get_float32_matmul_precision() == before
    with kernel_settings(RunConfig(precision="fp32"), torch.device("cpu")):
        assert torch.get_float32_matmul_precision() == before
    # a later field: stored configs keep their hashes
    assert RunConfig().config_hash() == RunConfig(tf32=False).config_hash()
    assert RunConfig(precision="fp32").config_hash() != RunConfig(precision="fp32", tf32=True).config_hash()


@pytest.mark.parametrize("precision", ["auto", "bf16", "bf16-pure", "fp16"])
def test_tf32_needs_fp32(precision):
    with pytest.raises(ValidationError, match="tf32 chooses how fp32 matmuls run: it needs precision=fp32"):
        RunConfig(precision=precision, tf32=True)


def test_tf32_refused_on_the_cpu(tb):
    code, _, err = tb("run", "--model", "tiny-llama", "--device", "cpu", "--precision", "fp32", "--tf32", "--no-store")
    assert code == 2 and "invalid tf32=true: TF32 is a format of NVIDIA GPUs' tensor cores" in err
    assert "Traceback" not in err


def test_plan_puts_tf32_between_fp32_and_bf16():
    """Same memory as fp32 (the tensors are fp32 either way), the tensor cores' speed; a V100 has no TF32."""
    fp32 = RunConfig(model="llama-3.2-1b", precision="fp32", seq_len=2048, batch_size=2)
    tf32, bf16 = fp32.model_copy(update={"tf32": True}), fp32.model_copy(update={"precision": "bf16"})
    h100 = gpu_named("H100-80GB")
    slow, fast, half = (predict(c, h100) for c in (fp32, tf32, bf16))
    assert fast.mem.peak_allocated == slow.mem.peak_allocated
    assert 2.5 * slow.tokens_per_s < fast.tokens_per_s < half.tokens_per_s  # measured: 3.3x fp32 (H100)
    v100 = gpu_named("V100")
    assert predict(tf32, v100).tokens_per_s == pytest.approx(predict(fp32, v100).tokens_per_s)


@GPU
def test_tf32_trains_as_fp32_does():
    """TF32 rounds the matmuls' inputs to 10 bits of mantissa: the same first loss to 1e-3, the curve close."""
    cfg = RunConfig(model="tiny-llama", precision="fp32", steps=6, warmup=1, seq_len=64, batch_size=2, lr=1e-3,
                    device="cuda", telemetry=False, dropout=0.0)
    exact, tf32 = run(cfg), run(cfg.model_copy(update={"tf32": True}))
    assert exact.status == tf32.status == "ok", tf32.error
    assert tf32.metrics.losses[0] == pytest.approx(exact.metrics.losses[0], rel=1e-3)
    assert tf32.metrics.losses == pytest.approx(exact.metrics.losses, rel=1e-2)
    assert tf32.metrics.losses != exact.metrics.losses  # TF32 did round
    assert torch.get_float32_matmul_precision() == "highest"
