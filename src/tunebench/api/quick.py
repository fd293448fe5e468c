"""The quick benchmark: a few runs sized for the machine, each stored as it finishes, then a report.

On a GPU it is the built-in `quick` suite (the seeds' Mistral-7B QLoRA baseline, seq 1024 x batch 4,
against the optimised seq 512 x batch 8); on a CPU, tiny-llama with each method.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tunebench.api.runs import run
from tunebench.config import RunConfig
from tunebench.record import ResultRecord
from tunebench.run_preflight import preflight
from tunebench.suites import expand, load_suite


def quick_configs(device: str = "auto") -> list[RunConfig]:
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return [e.config for e in expand(load_suite("quick"), {"device": "cuda", "tag": ["quick"]})]
    return [RunConfig(model="tiny-llama", method=m, seq_len=128, batch_size=4, steps=8, warmup=2, device="cpu",
                      tag=["quick"]) for m in ("full", "lora", "qlora")]


def quick(device: str, store: str | Path, out: str | Path,
          on_start: Callable[[int, int, RunConfig], None] | None = None) -> tuple[list[ResultRecord], list[Path]]:
    """Run the quick configurations (stored one by one) and write their report into `out`."""
    from tunebench.report.build import prepare_out, write_report
    from tunebench.report.cost import load_prices

    configs = quick_configs(device)
    for c in configs:
        preflight(c)  # refuse bad input before the first run starts
    prepare_out(Path(out))  # and a report folder that is not ours to write
    records = []
    for i, c in enumerate(configs):
        if on_start:
            on_start(i, len(configs), c)
        records.append(run(c, store, progress=True))
    return records, write_report(records, Path(out), load_prices(), "tunebench quick")
