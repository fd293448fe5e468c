import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tunebench.cli import main

QUICK = ["--model", "tiny-llama", "--steps", "4", "--warmup", "1", "--seq-len", "64", "--batch-size", "2",
         "--device", "cpu"]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "results.db"


@pytest.fixture
def tb(capsys):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""

    def _run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()  # drop what fixtures printed
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return _run


@pytest.fixture
def no_codegen(monkeypatch):
    """torch.compile as the compiled run traces, partitions and recomputes, without inductor's code generation
    (no_codegen_site/traced_only). For tests of what is traced, kept and recomputed; a cold code generation costs
    most of such a test's time."""
    import torch

    from no_codegen_site.traced_only import traced_only

    monkeypatch.setattr(torch, "compile", traced_only(torch.compile))


def no_codegen_env() -> dict[str, str]:
    """The environment for a subprocess whose ranks compile as `no_codegen` does in-process (the folder's
    sitecustomize replaces torch.compile at each process's start)."""
    site = str(Path(__file__).parent / "no_codegen_site")
    return {"PYTHONPATH": os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)}


_cpu_adam_build: subprocess.Popen | None = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """DeepSpeed compiles its CPU Adam (offload=optimizer) on first use, 45 s on CI's two cores: when a collected
    test needs it, it is built aside on one core, niced, while the tests before it run. A test that gets there
    first waits on the build's lock (torch.utils.cpp_extension), as it would on its own build."""
    global _cpu_adam_build
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None or not any(i.get_closest_marker("cpu_adam") for i in session.items):
        return
    _cpu_adam_build = subprocess.Popen(
        [sys.executable, "-c", "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ | {"MAX_JOBS": "1"},
        preexec_fn=lambda: os.nice(10))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Never left half-built: a build killed holding its lock would leave every later load waiting on it."""
    if _cpu_adam_build is not None:
        _cpu_adam_build.wait()


def bpe_tokenizer(texts: list[str], specials: list[str], vocab_size: int, **named: str):
    """A byte-level BPE tokenizer trained on `texts` here, as transformers' fast tokenizer; `named`: its special
    tokens by role (bos_token="<s>", ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials))
    return PreTrainedTokenizerFast(tokenizer_object=tok, **named)


COUNTING = "zero one two three four five six seven eight nine ten".split()


def counting_model(root: Path, n: int = 400, rng=None, chat_template: str | None = None) -> list[str]:
    """root/model: a local Llama-shaped model (random weights) with a BPE tokenizer trained on `n` runs of counting
    words ("two three four"); root/text.jsonl: those texts, returned. `rng` draws them (random.Random(0))."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    rng = rng or random.Random(0)
    texts = []
    for _ in range(n):
        a, k = rng.randrange(0, 6), rng.randrange(3, 6)
        texts.append(" ".join(COUNTING[a:a + k]))
    fast = bpe_tokenizer(texts, ["<pad>", "<s>", "</s>", "<unk>"], 300, bos_token="<s>", eos_token="</s>",
                         pad_token="<pad>", unk_token="<unk>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(root / "model")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    ).save_pretrained(root / "model")
    (root / "text.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return texts


def run_json(tb, store: Path, *extra: str) -> dict:
    code, out, err = tb("run", *QUICK, "--json", "--store", str(store), *extra)
    rec = json.loads(out)
    assert code == (0 if rec["status"] == "ok" else 1), err
    return rec


def cli_subprocess(*argv: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunebench.cli", *argv], capture_output=True, text=True,
                          env=os.environ | (env or {}), **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RUN_MARKS = ("tunebench.launch.worker", "tunebench.launch.child", "torch.distributed.run")


def runs_alive(tag: str) -> list[psutil.Process]:
    """Processes of a run whose config carries `tag` (in their run directory's job.json)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if any(m in cmd for m in RUN_MARKS):
                rundir = next((Path(a) for a in p.info["cmdline"] if a.startswith(tempfile.gettempdir())), None)
                if rundir is None or not (rundir / "job.json").exists() or tag in (rundir / "job.json").read_text():
                    found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    return found


def runs_gone(tag: str, within: float = 10.0) -> bool:
    """Within `within` seconds no process of a run tagged `tag` is left."""
    deadline = time.time() + within
    while time.time() < deadline:
        if not [p for p in runs_alive(tag) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.3)
    return False
