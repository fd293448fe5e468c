"""tunebench's FSDP2 full fine-tune against the plain FSDP2 script a user writes, Llama-3-8B by default.

Plain: the Hugging Face model built from its config on the meta device, `fully_shard` on every decoder layer
and then the root (bf16 compute, fp32 reduction), `to_empty` and N(0, 0.02) weights, per-block activation
checkpointing through `gradient_checkpointing_enable` (`--ckpt`), each decoder layer `torch.compile`d, fused
AdamW, clipping at 1.0, the model's own loss (`labels=`); random tokens. Ours: `tunebench.run` with strategy fsdp,
the same shapes, `grad_ckpt` as asked and compile as `auto` decides. Each side is its own torchrun job, one after
the other in this one job on the same GPUs; each rank times the steps after `warmup`, tokens/s per GPU is every
rank's tokens over the slowest rank's time, divided by the GPUs. MFU is PaLM-style: (6N + 12·L·H·S) per token
over the bf16 dense peak (989 TFLOP/s for H100 and H200), N the parameters without the embeddings.

    python benchmarks/compare/vs_plain_fsdp.py --gpus 4 --sides plain-ckpt,ours-ckpt,plain,ours --batch-size 2
    python benchmarks/compare/vs_plain_fsdp.py --model tiny-llama --device cpu --gpus 2 --seq-len 64 --batch-size 1 \\
        --steps 4 --warmup 1 --sides plain-ckpt,ours-ckpt  # smoke test with gloo
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sides import add_arguments, as_side_process, chosen, our_rank, run_side, save, start_rank, timed_rank  # noqa: E402
from vs_plain_gpt import print_profiles  # noqa: E402

SIDES = ("plain", "plain-ckpt", "ours", "ours-ckpt", "ours-ckpt-around")  # -around: ckpt_traced false
PEAK_BF16 = 989e12  # H100 / H200 SXM dense bf16


def plain_rank(a: argparse.Namespace) -> None:
    """One rank of the plain side (under torchrun); rank 0 prints the combined result."""
    import torch
    from accelerate import init_empty_weights
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    from tunebench.models.spec import resolve_model

    dev = start_rank(a.device)
    cuda = dev.type == "cuda"
    spec = resolve_model(a.model)
    with init_empty_weights(include_buffers=False):  # parameters on meta, the rotary table computed on the CPU
        model = AutoModelForCausalLM.from_config(spec.hf_config, attn_implementation="sdpa", dtype=torch.float32)
    buffers = [(m, n, b) for m in model.modules() for n, b in m.named_buffers(recurse=False)]
    model.config.use_cache = False
    if a.side == "plain-ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cuda else None, reduce_dtype=torch.float32)
    # the layers take the root's bf16 output as it is: torch before 2.13 skipped their input cast when
    # checkpointing recomputed them, and the recompute's dtypes then differed (CheckpointError)
    layer_mp = MixedPrecisionPolicy(param_dtype=mp.param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=layer_mp)
        if cuda:
            layer.compile()
    fully_shard(model, mp_policy=mp)
    model.to_empty(device=dev)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0.0, 0.02)
    for m, n, b in buffers:  # to_empty left them uninitialised
        m._buffers[n] = b.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0, fused=cuda)

    def train(ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    timed_rank(a, dev, train, spec.vocab_size, a.seq_len, a.profile)


def _our_config(a: argparse.Namespace, side: str, world: int):
    from tunebench import RunConfig

    return RunConfig(model=a.model, method="full", seq_len=a.seq_len, batch_size=a.batch_size, steps=a.steps,
                     warmup=a.warmup, optimizer="adamw_fused" if a.device == "cuda" else "adamw", grad_clip=1.0,
                     precision=a.precision,
                     grad_ckpt=side.startswith("ours-ckpt"), ckpt_traced=not side.endswith("-around"),
                     device=a.device, strategy="fsdp", nproc_per_node=world,
                     telemetry=False, tag=["vs_plain_fsdp"])


def ours(a: argparse.Namespace, side: str, world: int) -> dict:
    from tunebench import run

    rec = run(_our_config(a, side, world))
    m = rec.metrics
    return {"side": side, "status": rec.status, "error": rec.error, "world": world,
            "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu, "loss_last": m.loss_last,
            "compile_scope": m.compile_scope, "mfu_reported": m.mfu,
            "peak_alloc_gib": m.peak_mem_allocated_bytes / 2**30 if m.peak_mem_allocated_bytes else None}


def palm_flops_per_token(model: str, seq_len: int) -> float:
    from tunebench.models.count import counts
    from tunebench.models.spec import resolve_model

    spec = resolve_model(model)
    n = counts(spec)  # a mixture of experts: the weights one token multiplies by (its k experts, the routers)
    return 6 * (n.matmul if n.experts else n.total - n.embeddings) + 12 * spec.num_layers * spec.hidden_size * seq_len


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--precision", default="auto", help="ours: RunConfig's precision (bf16-pure: bf16 weights and "
                                                        "states, where fp32 masters do not fit)")
    p.add_argument("--profile", type=int, default=0, help="then profile this many steps per side (GPU time by kind "
                                                           "of kernel; ours then runs under torchrun from the "
                                                           "runner's pieces, not through tunebench.run)")
    add_arguments(p, SIDES, "plain-ckpt,ours-ckpt")
    a = p.parse_args()
    def rank(a: argparse.Namespace) -> None:  # ours under torchrun with --profile
        if a.side.startswith("plain"):
            return plain_rank(a)
        our_rank(a, lambda world: _our_config(a, a.side, world), a.profile)

    if as_side_process(a, rank, ours):
        return
    shape = ["--model", a.model, "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size), "--steps",
             str(a.steps), "--warmup", str(a.warmup), "--device", a.device, "--profile", str(a.profile),
             "--precision", a.precision]
    results: list[dict] = []
    for side in chosen(p, a, SIDES):
        results.append(run_side(__file__, side, a.gpus, shape, a.side_timeout, torchrun=a.profile > 0))
        save(a.out, results)
    summary(results, palm_flops_per_token(a.model, a.seq_len))


def summary(results: list[dict], flops: float) -> None:
    ok = {r["side"]: r["tokens_per_s_per_gpu"] for r in results if r.get("status") == "ok"}
    print(f"\n{'side':<17}{'GPUs':>5}{'tok/s/GPU':>11}{'PaLM MFU':>10}{'peak GiB':>10}{'vs plain':>10}")
    for r in results:
        if r.get("status") != "ok":
            print(f"{r['side']:<17}{r['world']:>5}  failed: {str(r.get('error'))[-400:]}")
            continue
        tps, plain = r["tokens_per_s_per_gpu"], ok.get(r["side"].replace("ours", "plain").removesuffix("-around"))
        ratio = f"{tps / plain:10.3f}" if plain and r["side"].startswith("ours") else f"{'':>10}"
        peak = f"{r['peak_alloc_gib']:10.1f}" if r.get("peak_alloc_gib") else f"{'':>10}"
        print(f"{r['side']:<17}{r['world']:>5}{tps:>11,.0f}{tps * flops / PEAK_BF16:>10.1%}{peak}{ratio}")
    print_profiles(results, top=12)  # rank 0's, with --profile


if __name__ == "__main__":
    main()
