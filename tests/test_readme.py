"""Every example in the README and docs/ works as written: run where a CPU can run it, validated where it needs GPUs.

Validated means: parsed by tunebench's own CLI parser, and the configuration it names built and checked
as `run` would check it on a GPU machine (strategy against the world size, the model's positions, the
suite's expansion), without training. The YAML files the README and docs/ show (a block whose first line is
`# name.yaml`) are written where the commands run. The README's Python examples are executed, and so are docs/'
that start from tunebench; the others read what a job left (validated: compiled). Every relative link of the
README and docs/ leads to a file or folder, and the paths docs/architecture.md names exist.
"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tunebench.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "README.md").read_text()
DOCS = {f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
# Examples that need what only a reader has (a GPU, an id from their store, their files): validated, not run.
PLACEHOLDERS = ("SWEEP_ID", "3fa2c1", "baseline.db", "node0.db", "/models/my-llama", "diagnostic-20261121",
                "tune-mistral-7b-20261121", "gpu-results.db")
RUN_ON_CPU = ("results list", "results schema", "results export", "report ", "deploy ", "plan ")


def _blocks(lang: str, text: str = TEXT) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _commands() -> list[str]:
    out = []
    for block in _blocks("bash") + [b for text in DOCS.values() for b in _blocks("bash", text)]:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("tunebench "):
                out.append(line)
    return out


def _yaml_files(where: Path) -> None:
    for block in _blocks("yaml") + [b for text in DOCS.values() for b in _blocks("yaml", text)]:
        first = block.splitlines()[0]
        if first.startswith("# ") and first.endswith(".yaml"):
            (where / first[2:]).parent.mkdir(parents=True, exist_ok=True)
            (where / first[2:]).write_text(block)


def test_the_first_two_commands_and_ci():
    lines = [ln.strip() for ln in TEXT.splitlines()[:10] if ln.startswith("    python3 -m venv")]
    assert len(lines) == 2 and lines[0].endswith("tunebench quick") and lines[1].endswith("python -m pytest -q")
    assert lines[1] in (ROOT / ".ci" / "run").read_text()


def _validate(argv: list[str]) -> None:
    from tunebench.flags import config_from
    from tunebench.models.spec import resolve_model
    from tunebench.strategies import STRATEGIES

    user = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.command in ("run", "consistency"):
        cfg = config_from(args, device="cuda")
        default = cfg.nproc_per_node or (1 if cfg.strategy == "single" else 8)  # all visible GPUs: say a node of 8
        for n in [int(x) for x in (getattr(args, "gpus", None) or "").split(",") if x] or [default]:
            STRATEGIES[cfg.strategy].check(cfg.model_copy(update={"nproc_per_node": n}), n * cfg.nnodes, packages=False)
        if not cfg.model.startswith("/"):
            spec = resolve_model(cfg.model)
            assert not spec.max_positions or cfg.seq_len <= spec.max_positions
    elif args.command == "sweep" and args.suite:
        from tunebench.api import plan_sweep
        from tunebench.suites import parse_sets

        assert plan_sweep(args.suite, parse_sets(args.set), args.repeats).entries
    elif args.command == "tune" and not args.resume:  # the search's settings, checked as tune checks them
        from tunebench.api.tune import check_settings
        from tunebench.commands.tune import settings_from

        check_settings(settings_from(args))
    elif args.command in ("hw", "load", "infer"):
        from tunebench.config import HwConfig, InferConfig, LoadConfig

        config_from(args, {"hw": HwConfig, "load": LoadConfig, "infer": InferConfig}[args.command])
    assert not user or user[0] in ("run", "sweep")


@pytest.mark.parametrize("line", _commands())
def test_bash_example(line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _yaml_files(tmp_path)
    argv = shlex.split(line)[1:]
    _validate(argv)
    if any(p in line for p in PLACEHOLDERS) or not any(line.startswith("tunebench " + r) for r in RUN_ON_CPU):
        return
    store = tmp_path / "tunebench-results" / "results.db"
    if not line.startswith("tunebench deploy"):  # the store commands read a store with one real result in it
        assert main(["run", "--model", "tiny-llama", "--steps", "2", "--warmup", "1", "--seq-len", "16",
                     "--device", "cpu", "--store", str(store)]) == 0
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize("code", _blocks("python"), ids=lambda c: c.splitlines()[-1][:40])
def test_python_example(code, tmp_path):
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    if (tmp_path / "results.db").exists():  # the README's two-process run from Python, its record stored
        from tunebench import Store

        with Store(tmp_path / "results.db") as store:
            records = list(store.records())
        assert len(records) == 1 and records[0].status == "ok"  # saved once, by the caller's process
        m = records[0].metrics
        assert m.world_size == len(m.per_rank) == 2 and m.timed_tokens == sum(r.tokens for r in m.per_rank)


def _runs(code: str) -> bool:
    """A docs/ example that starts from tunebench runs as the README's do; the others read a job's outputs."""
    return code.startswith(("from tunebench", "import tunebench"))


@pytest.mark.parametrize("code", [c for text in DOCS.values() for c in _blocks("python", text) if _runs(c)],
                         ids=lambda c: c.splitlines()[-1][:40])
def test_docs_python_example(code, tmp_path):
    test_python_example(code, tmp_path)


@pytest.mark.parametrize("code", [c for text in DOCS.values() for c in _blocks("python", text)],
                         ids=lambda c: c.splitlines()[-1][:40])
def test_docs_python_example_compiles(code):
    compile(code, "<docs example>", "exec")


def test_the_readme_is_short():
    """The README says what tunebench is and how to start; the reference is in docs/."""
    assert len(TEXT.encode()) < 10_000


def _prose(text: str) -> str:
    """Markdown without its code: fenced blocks, then inline code spans."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def test_relative_links_lead_somewhere():
    pages = {"README.md": TEXT, **DOCS}
    broken = []
    for name, text in pages.items():
        for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", _prose(text)):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (ROOT / name).parent / target.split("#")[0]
            if not path.exists():
                broken.append(f"{name}: {target}")
    assert not broken, broken


def test_the_architecture_names_paths_that_exist():
    text = DOCS["docs/architecture.md"]
    paths = set(re.findall(r"`(src/tunebench/[^`\s]*)`", text))
    assert len(paths) > 20
    missing = [p for p in sorted(paths) if not (ROOT / (p.split("<")[0] if "<" in p else p)).exists()]
    assert not missing, missing
