"""The quick benchmark: a few runs sized for the machine, stored, then one comparison table.

On a GPU it is the built-in `quick` suite (the seeds' Mistral-7B QLoRA baseline, seq 1024 x batch 4,
against the optimised seq 512 x batch 8); on a CPU, tiny-llama with each method.
"""

from __future__ import annotations

import torch

from tunebench.config import RunConfig
from tunebench.suites import expand, load_suite


def quick_configs(device: str = "auto") -> list[RunConfig]:
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return [e.config for e in expand(load_suite("quick"), {"device": "cuda", "tag": ["quick"]})]
    return [RunConfig(model="tiny-llama", method=m, seq_len=128, batch_size=4, steps=8, warmup=2, device="cpu",
                      precision="bf16", tag=["quick"]) for m in ("full", "lora", "qlora")]
