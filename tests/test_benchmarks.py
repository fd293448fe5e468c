"""benchmarks/: the GPU proofs' suites expand and pass each strategy's checks, their driver parses and names only
files that exist, and every script there compiles (none of it runs here: it needs GPUs)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tunebench.api import plan_sweep
from tunebench.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
PROOFS = sorted((BENCH / "proofs").glob("*.yaml"))
RUN_SH = BENCH / "proofs" / "run.sh"


def test_there_are_proofs():
    assert len(PROOFS) >= 5 and RUN_SH.is_file()


@pytest.mark.parametrize("suite", PROOFS, ids=lambda p: p.stem)
def test_proof_suite_expands_and_each_config_passes_its_strategy(suite):
    entries = plan_sweep(str(suite), {}, 1).entries
    assert entries
    for e in entries:
        cfg = e.config
        n = cfg.nproc_per_node or (1 if cfg.strategy == "single" else 8)  # all visible GPUs: say a node of 8
        STRATEGIES[cfg.strategy].check(cfg.model_copy(update={"nproc_per_node": n}), n * cfg.nnodes, packages=False)


def test_run_sh_parses():
    bash = shutil.which("bash")
    assert bash, "bash is needed to check benchmarks/proofs/run.sh"
    done = subprocess.run([bash, "-n", str(RUN_SH)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_file_run_sh_names_exists():
    text = RUN_SH.read_text()
    named = set(re.findall(r"\b((?:benchmarks|tests)/[a-z0-9_./-]+\.(?:py|yaml|sh))\b", text))
    assert any(n.startswith("benchmarks/compare/") for n in named)
    assert not [n for n in named if not (ROOT / n).is_file()]
    # each topic with a suite of its own: the case the driver has for it
    topics = {t for case in re.findall(r"^([a-z0-9|-]+)\)", text, flags=re.M) for t in case.split("|")}
    assert {p.stem for p in PROOFS} <= topics


@pytest.mark.parametrize("script", sorted(BENCH.rglob("*.py")), ids=lambda p: str(p.relative_to(BENCH)))
def test_benchmark_script_compiles(script):
    compile(script.read_text(), str(script), "exec")
