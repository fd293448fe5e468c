"""DPO's reference against the policy at the start (LoRA's B = 0: the same function), on one batch of synthetic pairs:
how far apart their answers' log-probabilities come out, per answer and per token, the way each is computed (the
adapters disabled or, compiled, scaled by zero; the policy's forward with the adapters on). A gap is the first loss's
distance from log 2. The policy run twice on the same batch gives the floor: what the GPU's kernels differ by from one
run to the next.

    python benchmarks/probes/reference_match.py [--model llama-3.2-1b] [--method lora] [--attn sdpa|eager]
"""

from __future__ import annotations

import argparse

import torch

from tunebench.config import RunConfig
from tunebench.dist import DistContext
from tunebench.engine.data import SyntheticPairs
from tunebench.engine.model import unwrap
from tunebench.engine.step import autocast, kernel_settings
from tunebench.run_preflight import preflight
from tunebench.runner import Outcome, build_trainable


def gap(model: str, method: str, compiled: bool, ckpt: bool, traced: bool, attn: str = "sdpa") -> dict:
    cfg = RunConfig(model=model, method=method, objective="dpo", batch_size=4, seq_len=1024, grad_ckpt=ckpt,
                    ckpt_traced=traced if ckpt else True, compile=compiled, precision="bf16", attn=attn)
    plan = preflight(cfg)
    t = build_trainable(plan, Outcome(), DistContext())
    inner = t.module
    b = SyntheticPairs(plan.spec.vocab_size, 4, 1024, plan.device, 0).next()
    out = {}
    with kernel_settings(cfg, plan.device), autocast(cfg, plan.device):
        for _ in range(2):  # the second pass: compiled graphs warm
            ref = inner.reference_logps(*b[:4])
            policy, _ = inner._logps(unwrap(inner.model), *b[:4])  # with gradients, as the step's
        again = inner._logps(unwrap(inner.model), *b[:4])[0].sums.detach()  # the floor: the GPU's own run-to-run
        counts = policy.counts.clamp(min=1)
        diff = (policy.sums.detach() - ref).abs()
        out = {"per_answer_max": float(diff.max()), "per_token_mean": float((diff / counts).mean()),
               "first_loss": float(inner(*b[:4]).detach()),
               "policy_again_max": float((policy.sums.detach() - again).abs().max())}
    del t
    torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--method", default="lora")
    p.add_argument("--attn", default="sdpa", help="eager: a soft-capped model without FlexAttention")
    a = p.parse_args()
    for compiled, ckpt, traced in ((False, False, True), (True, False, True), (True, True, True), (True, True, False)):
        r = gap(a.model, a.method, compiled, ckpt, traced, a.attn)
        print(f"compile {compiled!s:5} ckpt {ckpt!s:5} traced {traced!s:5}: |policy - reference| per answer max "
              f"{r['per_answer_max']:.4f}, per token {r['per_token_mean']:.6f}; first loss {r['first_loss']:.4f} "
              f"(log 2 = 0.6931); |policy - policy run again| max {r['policy_again_max']:.4f}", flush=True)


if __name__ == "__main__":
    main()
