"""`tunebench run` with every torch.compile call in reduce-overhead mode (CUDA graphs), to compare with a plain run.

    python benchmarks/cudagraph_probe.py run --model mistral-7b --method qlora --seq-len 512 --batch-size 8 ...

Measured on an H200 (benchmarks/RESULTS.md): no gain; per-block graphs leave CUDA graphs' fast path.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import torch  # noqa: E402

_orig = torch.nn.Module.compile


def _compile(self, *a, **k):
    k.setdefault("mode", "reduce-overhead")
    return _orig(self, *a, **k)


torch.nn.Module.compile = _compile
from tunebench.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
