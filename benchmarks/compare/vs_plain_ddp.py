"""tunebench's DDP and ZeRO-2 against the plain scripts a user writes, TinyGPT (GPT-2 small) full fine-tune.

Plain DDP: the nanoGPT-shaped model of `vs_plain_gpt.py` wrapped in `DistributedDataParallel` (default buckets),
fp32 weights under bf16 autocast, fused AdamW, clipping at 1.0, optionally `torch.compile`d (`plain-ddp-compile`:
the DDP module compiled, as PyTorch's docs show). Plain ZeRO-2: the same model through `deepspeed.initialize` with
the config users copy (bf16, stage 2, overlap_comm, contiguous gradients, 5e8 buckets) and the same AdamW. Our
sides: `tunebench.run` with strategy ddp or zero2 (compile as `auto` decides; `ours-ddp-model`: the whole model
compiled, `compile_scope: model`). Each side is its own torchrun job, one after the other in this one job on the
same GPUs; each rank times the steps after `warmup`, and tokens/s is every rank's tokens over the slowest rank's time.
`--gpus 1,4` runs every side at each world size and prints the scaling efficiency, tokens/s(N) / (N x tokens/s(1)).
Where the step's time goes: `steps-ddp` (our DDP step built from the runner's pieces under torchrun, as `run`
builds it) and `plain-ddp-prof` (the plain DDP side) each profile rank 0's steps after the timed ones (GPU time by
kind of kernel, NCCL's apart, and the compute kernels' share of the step).

    python benchmarks/compare/vs_plain_ddp.py --gpus 1,4 [--sides plain-ddp,ours-ddp,plain-zero2,ours-zero2]
    python benchmarks/compare/vs_plain_ddp.py --device cpu --gpus 2 --seq-len 64 --batch-size 1 --steps 4 \\
        --warmup 1  # smoke
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE))

from sides import add_arguments, as_side_process, chosen, our_rank, run_side, save, start_rank, timed_rank  # noqa: E402

SIDES = ("plain-ddp", "plain-ddp-compile", "plain-zero2", "ours-ddp", "ours-zero2", "ours-ddp-pure",  # -pure: bf16-pure
         "ours-ddp-model",  # the whole model compiled (compile_scope: model)
         "steps-ddp", "plain-ddp-prof")  # our DDP step from the runner's pieces and the plain one, each profiled
PROFILE_STEPS = 5


def plain_rank(a: argparse.Namespace) -> None:
    """One rank of a plain side (under torchrun): train, time, and let rank 0 print the combined result."""
    import torch

    from vs_plain_gpt import VOCAB, plain_model, plain_train_step

    dev = start_rank(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    model = plain_model(a.seq_len, 0.1).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0, fused=cuda)
    if a.side == "plain-zero2":
        import deepspeed

        ds = {"train_micro_batch_size_per_gpu": a.batch_size, "gradient_accumulation_steps": 1,
              "gradient_clipping": 1.0, "bf16": {"enabled": cuda}, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                                    "reduce_bucket_size": int(5e8), "allgather_bucket_size": int(5e8)},
              "steps_per_print": 1 << 30}
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds, dist_init_required=False)

        def train(ids: torch.Tensor) -> torch.Tensor:
            loss = engine(ids[:, :-1], ids[:, 1:])
            engine.backward(loss)
            engine.step()
            return loss
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
        fwd = torch.compile(ddp) if a.side == "plain-ddp-compile" else ddp
        train = plain_train_step(fwd, model, opt, dev.type, autocast=cuda)

    # inputs and their next tokens; -prof: rank 0's steps profiled after the timed ones
    timed_rank(a, dev, train, VOCAB, a.seq_len + 1, PROFILE_STEPS if a.side.endswith("-prof") else 0)


def _our_config(a: argparse.Namespace, side: str, world: int):
    from tunebench import RunConfig

    strategy = side.removeprefix("ours-").removeprefix("steps-").removesuffix("-pure").removesuffix("-model")
    whole = {"compile": True, "compile_scope": "model"} if side.endswith("-model") else {}
    return RunConfig(model="tinygpt-124m", method="full", seq_len=a.seq_len, batch_size=a.batch_size, **whole,
                     steps=a.steps, warmup=a.warmup, optimizer="adamw_fused" if a.device == "cuda" else "adamw",
                     grad_clip=1.0, device=a.device, strategy=strategy,
                     precision="bf16-pure" if side.endswith("-pure") and a.device == "cuda" else "auto",
                     nproc_per_node=world, telemetry=False, tag=["vs_plain_ddp"])


def ours(a: argparse.Namespace, side: str, world: int) -> dict:
    from tunebench import run

    rec = run(_our_config(a, side, world))
    m = rec.metrics
    return {"side": side, "status": rec.status, "error": rec.error, "world": world, "tokens_per_s": m.tokens_per_s,
            "loss_last": m.loss_last, "compile_scope": m.compile_scope,
            "peak_alloc_gib": m.peak_mem_allocated_bytes / 2**30 if m.peak_mem_allocated_bytes else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="4", help="world sizes, comma-separated (e.g. 1,4)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    add_arguments(p, SIDES, "plain-ddp,ours-ddp,plain-zero2,ours-zero2")
    a = p.parse_args()
    def rank(a: argparse.Namespace) -> None:
        if a.side == "steps-ddp":  # ours from the runner's pieces, profiled
            return our_rank(a, lambda world: _our_config(a, a.side, world), PROFILE_STEPS)
        plain_rank(a)

    if as_side_process(a, rank, ours):
        return
    sides = chosen(p, a, SIDES)
    shape = ["--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size), "--steps", str(a.steps), "--warmup",
             str(a.warmup), "--device", a.device]
    results: list[dict] = []
    for world in (int(g) for g in a.gpus.split(",")):
        for side in sides:
            results.append(run_side(__file__, side, world, shape, a.side_timeout, torchrun=side == "steps-ddp"))
            save(a.out, results)
    summary(results)


def summary(results: list[dict]) -> None:
    ok = {(r["side"], r["world"]): r["tokens_per_s"] for r in results if r.get("status") == "ok"}
    print(f"\n{'side':<20}{'GPUs':>5}{'tokens/s':>12}{'vs plain':>10}{'scaling':>9}")
    for r in results:
        if r.get("status") != "ok":
            print(f"{r['side']:<20}{r['world']:>5}  failed: {str(r.get('error'))[-400:]}")
            continue
        side, world, tps = r["side"], r["world"], r["tokens_per_s"]
        plain = ok.get(("plain-" + side.split("-")[1], world))
        if prof := r.get("profile"):  # rank 0's GPU time per step, by kind of kernel
            kinds = ", ".join(f"{k} {v:.1f}" for k, v in prof["ms_by_kind"].items())
            print(f"    profile {side} x{world}: wall {prof['wall_ms']:.1f} ms, compute busy "
                  f"{prof['compute_busy_ms']:.1f} ms; {kinds}")
        one = ok.get((side, 1))
        ratio = f"{tps / plain:10.3f}" if plain and side.startswith("ours") else f"{'':>10}"
        scaling = f"{tps / (world * one):9.1%}" if one and world > 1 else f"{'':>9}"
        print(f"{side:<20}{world:>5}{tps:>12,.0f}{ratio}{scaling}")


if __name__ == "__main__":
    main()
