import json
import os
import socket
import subprocess
import sys
from pathlib import Path

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
