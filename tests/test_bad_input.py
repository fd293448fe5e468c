"""Every invalid input is refused before a model is built: one line on stderr, exit code 2."""

import pytest

from conftest import cli_subprocess

BASE = ["run", "--device", "cpu", "--steps", "4", "--warmup", "1"]

CASES = {
    "batch zero": (["--batch-size", "0"], "batch_size"),
    "batch negative": (["--batch-size", "-3"], "batch_size"),
    "batch not a number": (["--batch-size", "eight"], "batch_size"),
    "steps zero": (["--steps", "0"], "steps"),
    "seq zero": (["--seq-len", "0"], "seq_len"),
    "grad accum zero": (["--grad-accum", "0"], "grad_accum"),
    "steps equal warmup": (["--steps", "5", "--warmup", "5"], "warmup"),
    "steps below warmup": (["--steps", "3", "--warmup", "10"], "warmup"),
    "unknown model": (["--model", "gpt-9"], "model"),
    "unknown method": (["--method", "prefix"], "method"),
    "unknown optimizer": (["--optimizer", "sgd"], "optimizer"),
    "unknown precision": (["--precision", "fp8"], "precision"),
    "seq above max positions": (["--seq-len", "4096"], "seq_len"),
    "lora rank zero": (["--method", "lora", "--lora-rank", "0"], "lora_rank"),
    "negative lr": (["--lr", "-1"], "lr"),
    "dropout above one": (["--lora-dropout", "1.5"], "lora_dropout"),
    "unknown lora target": (["--method", "lora", "--lora-targets", "qkv_fused"], "lora_targets"),
    "an empty lora target between commas": (["--method", "lora", "--lora-targets", "q_proj,,v_proj"], "lora_targets"),
    "fp16 on cpu": (["--precision", "fp16"], "precision"),
    "flash on cpu": (["--attn", "flash"], "attn"),
    "bf16-pure under deepspeed": (["--precision", "bf16-pure", "--strategy", "zero2"], "precision=bf16-pure with "
                                                                                      "strategy=zero2"),
    "offload outside deepspeed": (["--offload", "optimizer", "--strategy", "fsdp"], "offload=optimizer with "
                                                                                   "strategy=fsdp"),
    "unknown offload": (["--offload", "nvme"], "offload"),
    "compile neither on, off nor auto": (["--compile", "sometimes"], "compile=sometimes"),
    "unknown quant": (["--method", "qlora", "--quant", "int3"], "quant"),
    "unknown flag": (["--bogus", "1"], "--bogus"),
    "model path missing": (["--model", "/no/such/model/dir"], "does not exist"),
    "config file missing": (["/no/such/config.yaml"], "does not exist"),
}


def _check(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tunebench: error: ") and needle in lines[0]
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("name", list(CASES))
def test_bad_flag(tb, store, name):
    argv, needle = CASES[name]
    code, out, err = tb(*BASE, *argv, "--store", str(store))
    _check(code, out, err, needle)
    assert not store.exists()  # refused before anything ran, nothing stored


@pytest.mark.parametrize("text,needle", [
    ("method: lora\n  rank: [1, 2\n", "not valid YAML"),
    ("method: lora\nlora_rnak: 8\n", "unknown key 'lora_rnak'"),
    ("- just\n- a list\n", "mapping"),
    ("batch_size: 0\n", "batch_size"),
    ("model: tiny-llama\nsteps: two\n", "steps"),
])
def test_bad_yaml(tb, tmp_path, text, needle):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    _check(*tb("run", str(cfg), "--device", "cpu"), needle)


def test_local_dir_without_config(tb, tmp_path):
    _check(*tb(*BASE, "--model", str(tmp_path)), "no config.json")


def test_local_dir_with_broken_config(tb, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    _check(*tb(*BASE, "--model", str(tmp_path)), "could not be read")


def test_cuda_requested_without_gpu(tb):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _check(*tb("run", "--device", "cuda"), "device")


def test_unknown_result_id(tb, store):
    _check(*tb("results", "show", "deadbeef", "--store", str(store)), "no result")


@pytest.mark.parametrize("argv,needle", [
    (["--method", "qlora"], "method=qlora needs the 'bitsandbytes' package"),
    (["--optimizer", "adamw_8bit"], "optimizer=adamw_8bit needs the 'bitsandbytes' package"),
    (["--optimizer", "paged_adamw_8bit"], "bitsandbytes"),
])
def test_bitsandbytes_missing(tmp_path, argv, needle):
    """A real process where importing bitsandbytes fails, as on a machine without it."""
    fake = tmp_path / "shadow" / "bitsandbytes"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named bitsandbytes')\n")
    import os

    env = {"PYTHONPATH": f"{fake.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = cli_subprocess(*BASE, *argv, "--store", str(tmp_path / "r.db"), env=env)
    _check(p.returncode, p.stdout, p.stderr, needle)


def test_subprocess_exit_code_and_no_traceback(tmp_path):
    p = cli_subprocess(*BASE, "--batch-size", "0", "--store", str(tmp_path / "r.db"))
    _check(p.returncode, p.stdout, p.stderr, "batch_size=0")
