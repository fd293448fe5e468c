"""What a configuration's forward keeps for backward: every saved tensor of 1 MiB or more, grouped by shape.

    python benchmarks/probes/saved_probe.py --model mistral-7b --method qlora --seq-len 512 --batch-size 8 \\
        --grad-ckpt [--no-ckpt-traced]

Any `tunebench run` option is taken (RunConfig's fields, as `profile_trace.py` takes them). The model is built as
`run` builds it; two steps run first (compiling), then one forward runs under saved-tensor hooks that record what
autograd keeps: a checkpoint of Hugging Face's, around a block's call, hides what it drops; one traced inside a
compiled block shows what the compiled forward saved.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MIB = 1 << 20


def main() -> None:
    import torch

    from profile_trace import config_from_args
    from tunebench.dist import SINGLE
    from tunebench.engine.data import SyntheticTokens
    from tunebench.engine.step import kernel_settings, optimizer_step_fn
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable

    plan = preflight(config_from_args(sys.argv[1:]))
    t = build_trainable(plan, Outcome(), SINGLE)
    data = SyntheticTokens(plan.spec.vocab_size, plan.cfg.batch_size, plan.cfg.seq_len, plan.device, plan.cfg.seed)
    step = optimizer_step_fn(t.ts, data, plan.cfg, plan.device, SINGLE)
    with kernel_settings(plan.cfg, plan.device):  # as the runner's loop runs it
        for _ in range(2):
            step()
    params = {p.data_ptr() for p in t.module.parameters()}
    saved: Counter = Counter()

    def pack(x: torch.Tensor) -> torch.Tensor:
        if x.data_ptr() not in params and x.numel() * x.element_size() >= MIB:
            saved[(tuple(x.shape), str(x.dtype).removeprefix("torch."))] += 1
        return x

    with kernel_settings(plan.cfg, plan.device), torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        t.ts.micro(data.next(), True)  # packs run in its forward only
    t.ts.update()
    total = sum(count * torch.Size(shape).numel() * torch.empty((), dtype=getattr(torch, dtype)).element_size()
                for (shape, dtype), count in saved.items())
    print(f"saved for backward (1 MiB or more each, parameters apart): {total / MIB:,.0f} MiB")
    for (shape, dtype), count in saved.most_common(20):
        print(f"  {count:4d} x {dtype:9s} {shape}")


if __name__ == "__main__":
    main()
