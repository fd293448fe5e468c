"""The quick benchmark: a few runs sized for the machine, stored, then one comparison table.

On a GPU it is the seeds' quick pair (Mistral-7B QLoRA, baseline seq 1024 x batch 4 against the
optimised seq 512 x batch 8); on a CPU, tiny-llama with each method.
"""

from __future__ import annotations

import torch

from tunebench.config import RunConfig

QLORA = dict(model="mistral-7b", method="qlora", grad_ckpt=True, optimizer="paged_adamw_8bit", lora_rank=16,
             lora_alpha=32, precision="bf16", steps=20, warmup=5, tag=["quick"])


def quick_configs(device: str = "auto") -> list[RunConfig]:
    gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if gpu:
        return [RunConfig(**QLORA, seq_len=1024, batch_size=4, device="cuda"),
                RunConfig(**QLORA, seq_len=512, batch_size=8, device="cuda")]
    return [RunConfig(model="tiny-llama", method=m, seq_len=128, batch_size=4, steps=8, warmup=2, device="cpu",
                      precision="bf16", tag=["quick"]) for m in ("full", "lora", "qlora")]
