"""The code's shape is checked like its behaviour: layers, no import cycles, lint, sizes, one save site."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tunebench"
PARSERS = {"build_parser"}  # argument parsers may be long: one line per flag


def _tool(name: str) -> str:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or name


def test_import_contracts():
    p = subprocess.run([_tool("lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout


def test_ruff():
    p = subprocess.run([_tool("ruff"), "check", "src", "tests", "benchmarks"], cwd=ROOT, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout[-4000:]


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), deferred imports included."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return out


def test_no_import_cycles():
    graph = grimp.build_graph("tunebench")  # imports inside functions count too
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    class Fake:
        modules = {"a", "b", "c"}

        @staticmethod
        def find_modules_directly_imported_by(m):
            return {"a": {"b"}, "b": {"a"}, "c": set()}[m]

    assert _cycles(Fake()) == [["a", "b"]]


def _py_files():
    return sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", _py_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_module_and_function_sizes(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 400, f"{path.name} has {len(text.splitlines())} lines (at most 400)"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in PARSERS:
            n = node.end_lineno - node.lineno + 1
            assert n <= 60, f"{path.name}: {node.name} has {n} lines (at most 60)"


def _store_saves(tree: ast.AST) -> int:
    """Calls of Store.save: `Store(...).save(...)`, or `name.save(...)` inside `with Store(...) as name`."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.With):
            names = {i.optional_vars.id for i in node.items if isinstance(i.context_expr, ast.Call)
                     and getattr(i.context_expr.func, "id", None) == "Store" and isinstance(i.optional_vars, ast.Name)}
            n += sum(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "save"
                     and getattr(c.func.value, "id", None) in names for b in node.body for c in ast.walk(b))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "save" \
                and isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "id", None) == "Store":
            n += 1
    return n


def test_the_launching_process_imports_no_engine():
    """A distributed run's parent only checks and starts torchrun: transformers and the engine load in the ranks
    (2-3 s less before they start; run_preflight imports transformers only for a LoRA model's structure)."""
    code = ("import sys, tunebench.api.runs, tunebench.api.sweep, tunebench.api.train, tunebench.launch.torchrun; "
            "print(sorted(m for m in ('transformers', 'peft', 'tunebench.runner', 'tunebench.engine.loop') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_model_process_loads_transformers_without_scikit_learn_scipy_or_torchao():
    """tunebench's processes (launch.lean) load transformers' models and their losses without the scikit-learn that
    lm-evaluation-harness installs, SciPy, or torchao (seconds of every rank's start); each stays importable, and
    evaluation and float8 use them. Where transformers was told before that a package is installed, the module
    loads as it is."""
    for package in ("sklearn", "scipy", "torchao"):
        pytest.importorskip(package)
    code = ("import sys; from tunebench.launch import lean; lean.install(); lean.install(); "
            "import transformers.generation.candidate_generator as c; from transformers import LlamaForCausalLM; "
            "from transformers.loss.loss_utils import LOSS_MAPPING; import transformers.quantizers.auto; "
            "before = sorted(p for p in ('sklearn', 'scipy', 'torchao') if p in sys.modules); "
            "import sklearn.metrics, scipy.optimize, torchao; "
            "print(before, type(c.__loader__).__name__, sum(type(f).__name__ == '_Guard' for f in sys.meta_path))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "_Hiding", "1"]
    told = ("from tunebench.launch import lean; lean.install(); from transformers.utils import is_scipy_available; "
            "assert is_scipy_available(); import transformers.loss.loss_for_object_detection as d; "
            "print(d.linear_sum_assignment.__module__)")
    out = subprocess.run([sys.executable, "-c", told], capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith("scipy.optimize")


def test_results_are_saved_in_one_place():
    """Only tunebench.api.records calls Store.save: every new result goes through api.finalize."""
    callers = {str(p.relative_to(SRC)) for p in _py_files() if _store_saves(ast.parse(p.read_text()))}
    assert callers == {"api/records.py"}
    assert _store_saves(ast.parse("with Store(p) as s:\n    s.save(r)\nStore(p).save(r)\n")) == 2


def test_readme_matrix_is_the_registry():
    from tunebench.strategies import matrix_markdown

    assert matrix_markdown() in (ROOT / "docs" / "distributed.md").read_text(), \
        "docs/distributed.md's method x strategy table differs from the registry; paste " \
        "tunebench.strategies.matrix_markdown()"


def test_registry_names_are_the_config_choices():
    from typing import get_args

    from tunebench.config import Strategy
    from tunebench.strategies import STRATEGIES

    assert list(STRATEGIES) == list(get_args(Strategy))


def test_repository_stands_alone():
    """No reference to design documents that live outside the repository."""
    for path in [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py"),
                 *ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md"]:
        if path.name != "test_code_guards.py":
            assert "DESIGN.md" not in path.read_text(), path


def test_config_hashes_are_stable():
    """Stored sweeps are resumed by config hash: the identity of a configuration must not drift.

    Three deliberate changes: compile's default became `auto` (on for GPU training), the optimizer's became
    `adamw_fused` (was `adamw`, the foreach AdamW), and `hw` measures the host first: a configuration that leaves
    one unset is a new workload and has a new hash; one that says compile=false and optimizer=adamw, or hw's old
    sections, keeps the old one."""
    from tunebench.config import HwConfig, InferConfig, RunConfig

    assert RunConfig(precision="bf16", compile=False, optimizer="adamw").config_hash() == "57b72d7b11341487"
    assert RunConfig(model="mistral-7b", method="qlora", tag=["x"], timeout=5, run_timeout=9,
                     precision="bf16", compile=False, optimizer="adamw").config_hash() == "1a582c79576e3ced"
    assert RunConfig(precision="bf16", optimizer="adamw").config_hash() == "2e32bee2d45c4b14"
    assert RunConfig(precision="bf16", compile=False).config_hash() == "9cacefda60f4e0d2"  # fused AdamW
    assert HwConfig(sections=["matmul", "bandwidth", "collectives"]).config_hash() == "c3ea5bbf8701507f"
    assert HwConfig().config_hash() == "d4db69ff2dd1a552"  # with the host section
    assert InferConfig().record_config(precision="bf16", batch_size=1)[1] == "fc311c3578eb796f"
