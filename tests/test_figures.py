"""No measured figures in the code's prose: comments say why, the results say how much.

Comments, docstrings, pydantic `Field(description=...)` and argparse `help=` texts under src/tunebench may explain
a mechanism; what a run measured belongs in benchmarks/results/<topic>.md, which such a text may link once where
the reader needs it. A measurement copied into the code goes stale silently (the same figure used to sit in the
field, the README and the results). Definitions, formulas, protocol constants, spec-sheet values and the thresholds
the code uses are not measurements and stay.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tunebench"

# What may carry figures by design: a file under src/tunebench, or one line of one ("path:text of the line").
# gpus.py needs no entry: its spec-sheet values are the catalog's entries, code that this guard does not read.
EXEMPT = {
    "plan/calibration.py": "the planner's calibration table: each constant names the runs it was fitted on, so "
                           "that a refit can be checked against them",
}

NUM = r"(?<![\w.])[~≈]?\d[\d,]*(?:\.\d+)?"
# Units a run measures. Sizes, bandwidths and FLOP rates are also definitions and spec-sheet values (a 256 MiB
# buffer, a 989 TFLOP/s peak), so a figure in one of them counts only where its sentence says it was measured,
# profiled or run on a named GPU.
UNIT = r"\s*(?:tokens/s|tok/s|samples/s|TFLOP/s|TFLOPS|GB/s|TB/s|GiB|MiB|ms|µs|us)\b"
CONTEXT = re.compile(r"\bmeasured\b(?!/)|\bprofiled\b|\bRESULTS\.md|"
                     r"\bon (?:an? |\d+ |two |four )?(?:H100|H200|A100|B200|GH200)s?\b|"
                     r"\b(?:an?|one|the) (?:H100|H200|A100)\b|\b(?:H100|H200)s\b", re.I)
UNIT_FIGURE = re.compile(NUM + UNIT)
PATTERNS = (
    # a speedup or ratio: 1.45x, 2.5×, ~10x; not a shape (8 x 512, 8x512), a GPU count (4× H200), a hex literal
    # (0x{...}) or a count of work (2.5x the forward's FLOPs)
    ("ratio", re.compile(NUM + r"[x×](?![\w{])(?!\s*\d)(?!\s*(?:NVIDIA|H100|H200|A100|GPU|node))"
                               r"(?!\s+(?:the|its|a)\s+(?:\S+\s+){0,2}?(?:FLOPs|bytes|parameters|elements)\b)")),
    # a change: 5% faster, 30% below, 1-2.4% slower, a third of a step; +9%, -2.1% (not a bar such as ±5%)
    ("percent", re.compile(NUM + r"\s*%\s+(?:faster|slower|less|more|below|above|lower|higher|better|worse|"
                                 r"of (?:a|an|the|its) (?:step|step's|run))\b", re.I)),
    ("percent", re.compile(r"(?<![\w.±−-])[+−-]\d+(?:\.\d+)?\s*%")),
    # two figures set against each other: 3.60 ms against 5.13, 15,886 tokens/s against 10,861
    ("against", re.compile(NUM + r"(?:" + UNIT + r")?\s+(?:against|vs\.?|versus)\s+(?:[\w-]+'s\s+)?~?\d")),
    # "measured 45 ms", "measured: a third of", "took 29.8 ms", "took GPT-2's job from 5.12 to 4.62 GiB"
    ("measured", re.compile(r"\bmeasured:?\s+(?:at\s+|as\s+|about\s+)?(?:[~+−-]?\d|a third|a quarter|half|twice)",
                            re.I)),
    ("took", re.compile(r"\btook\s+(?:\S+\s+){0,6}?~?\d[\d,.]*" + UNIT)),
    # a time or a size one run took: ~17 ms of a 272 ms step, 1.6 s on a CPU, 0.9 s per process on 2 CPU cores,
    # +13 GiB held
    ("took", re.compile(NUM + r"\s?(?:ms|s|µs)\s+(?:of|per)\s+(?:an?|the|its)\s+(?:[\w.-]+\s+){0,3}?step\b")),
    ("took", re.compile(NUM + r"\s?(?:ms|s|µs)\b[^.;\n]{0,30}?\bon (?:an? |\d+ )?(?:[\w-]+ ){0,2}"
                              r"(?:CPUs?|cores?|machines?|hosts?|GPUs?)\b")),
    ("added", re.compile(r"(?<![\w.])\+~?\d+(?:\.\d+)?\s?(?:GiB|MiB|GB|ms)\b")),
    # the old single results file, the script that filled it, and benchmark scripts at their old places
    ("old link", re.compile(r"benchmarks/RESULTS\.md|gpu_proof\.sh|"
                            r"benchmarks/(?!results/|compare/|probes/|proofs/|data/)[\w-]+\.py")),
)


def texts(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of each comment block, docstring and description=/help= string of one file. A block is
    consecutive full-line comments; a comment after code on its line is a block of its own."""
    source = path.read_text()
    out: list[tuple[int, str]] = []
    block: list[tuple[int, str]] = []

    def close() -> None:
        if block:
            out.append((block[0][0], "\n".join(t for _, t in block)))
            block.clear()

    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        alone = not tok.line[:tok.start[1]].strip()
        if not alone or (block and tok.start[0] != block[-1][0] + 1):
            close()
        block.append((tok.start[0], tok.string.lstrip("#").strip()))
        if not alone:
            close()
    close()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
                out.append((doc.lineno, doc.value.value))
        elif isinstance(node, ast.keyword) and node.arg in ("description", "help"):
            text = "".join(v.value for v in ast.walk(node.value)
                           if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if text:
                out.append((node.value.lineno, text))
    return out


def _sentence(text: str, at: int) -> str:
    start = max(text.rfind(". ", 0, at), text.rfind(".\n", 0, at), text.rfind("; ", 0, at))
    ends = [i for i in (text.find(". ", at), text.find(".\n", at), text.find("; ", at)) if i >= 0]
    return text[start + 1:min(ends, default=len(text))]


def figures(text: str) -> list[tuple[int, str, str]]:
    """(where in the text, kind, what matched) for every measurement the text carries."""
    found = [(m.start(), kind, m.group()) for kind, rx in PATTERNS for m in rx.finditer(text)]
    found += [(m.start(), "figure", m.group()) for m in UNIT_FIGURE.finditer(text)
              if CONTEXT.search(_sentence(text, m.start()))]
    return sorted(found)


def carried(root: Path = SRC) -> list[str]:
    """'file:line: [kind: match] ...context...' for each measurement in the prose of every file under `root`."""
    out = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in EXEMPT:
            continue
        for first, text in texts(path):
            lines = text.splitlines() or [text]
            for at, kind, hit in figures(text):
                offset = text.count("\n", 0, at)
                if f"{rel}:{lines[offset].strip()}" in EXEMPT:
                    continue
                context = " ".join(text[max(0, at - 60):at + len(hit) + 60].split())
                out.add(f"src/tunebench/{rel}:{first + offset}: [{kind}: {' '.join(hit.split())}] ...{context}...")
    return sorted(out)


def test_the_patterns_catch_measurements_and_spare_definitions():
    caught = ["Mistral-7B 15,886 tokens/s against 10,861 on an H200", "2.8x inductor's kernel",
              "measured 1.6x slower than whole-block recompute", "it ran 2.1% faster", "QLoRA +14% (its layers)",
              "(measured ~45 ms of a 443 ms step)", "took 29.8 ms on an H200 machine's host",
              "3.60 ms against 5.13 in bf16", "see benchmarks/RESULTS.md", "on an H100: 43.95 GiB",
              "the attention took 2.5× as long", "an H200 job logged 726,670 tokens/s", "~17 ms of a 272 ms step",
              "1.6 s on a CPU", "27 s on a fresh 2-core machine", "(+13 GiB on Mistral-7B)", "1.08x, −36% memory",
              "0.3-0.9 s per process on 2 CPU cores", "bash benchmarks/gpu_proof.sh core", "(benchmarks/kernels_vs.py)",
              "took GPT-2 small's job from 5.12 to 4.62 GiB", "(measured: a third of an eager GPT-2 step)"]
    spared = ["batch 8 x 512", "4× H200 on one host", "fp32 elements: 256 MiB", "the seeds accept ±5% throughput",
              "tokens/s(N) / (N x tokens/s(1))", "a 256 MiB buffer is zeroed", "bf16 peak 989 TFLOP/s",
              "seq 1024 x batch 4", "2 x bytes / time", "at least 90% scaling efficiency", "0x{raw}",
              "faster where measured (benchmarks/results/qlora-lora.md)", "every `interval` seconds",
              "(2.5x the forward's FLOPs)", "a rank's exit seen within 0.1 s", "benchmarks/compare/kernels_vs.py",
              "benchmarks/probes/packed_attention.py", "a planner that is 10% optimistic on the measured/predicted ratio"]
    assert [t for t in caught if not figures(t)] == []
    assert [(t, figures(t)) for t in spared if figures(t)] == []


def test_exemptions_name_files_that_exist():
    assert [k for k in EXEMPT if not (SRC / k.split(":")[0]).is_file()] == []


def test_no_measured_figures_in_comments_docstrings_or_help():
    found = carried()
    assert not found, ("measured figures in the code's prose (say why here, and how much in "
                       "benchmarks/results/<topic>.md):\n" + "\n".join(found))
