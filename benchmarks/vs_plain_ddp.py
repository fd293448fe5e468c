"""tunebench's DDP and ZeRO-2 against the plain scripts a user writes, TinyGPT (GPT-2 small) full fine-tune.

Plain DDP: the nanoGPT-shaped model of `vs_plain_gpt.py` wrapped in `DistributedDataParallel` (default buckets),
fp32 weights under bf16 autocast, fused AdamW, clipping at 1.0, optionally `torch.compile`d. Plain ZeRO-2: the
same model through `deepspeed.initialize` with the config users copy (bf16, stage 2, overlap_comm, contiguous
gradients, 5e8 buckets) and the same AdamW. Our sides: `tunebench.run` with strategy ddp or zero2 (compile as
`auto` decides). Each side is its own torchrun job, one after the other in this one job on the same GPUs; each
rank times the steps after `warmup`, and tokens/s is every rank's tokens over the slowest rank's time.
`--gpus 1,4` runs every side at each world size and prints the scaling efficiency, tokens/s(N) / (N x tokens/s(1)).

    python benchmarks/vs_plain_ddp.py --gpus 1,4 [--sides plain-ddp,ours-ddp,plain-zero2,ours-zero2]
    python benchmarks/vs_plain_ddp.py --device cpu --gpus 2 --seq-len 64 --batch-size 1 --steps 4 --warmup 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

SIDES = ("plain-ddp", "plain-ddp-compile", "plain-zero2", "ours-ddp", "ours-zero2")


def plain_rank(a: argparse.Namespace) -> None:
    """One rank of a plain side (under torchrun): train, time, and let rank 0 print the combined result."""
    import torch
    import torch.distributed as dist

    from vs_plain_gpt import VOCAB, plain_model, plain_train_step

    cuda = a.device == "cuda"
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
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
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None)
        fwd = torch.compile(ddp) if a.side == "plain-ddp-compile" else ddp
        train = plain_train_step(fwd, model, opt, dev.type, autocast=cuda)

    gen = torch.Generator(device=dev).manual_seed(rank)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(a.steps):
        if i == a.warmup:
            sync()
            dist.barrier()
            start = time.perf_counter()
        loss = train(torch.randint(0, VOCAB, (a.batch_size, a.seq_len + 1), generator=gen, device=dev))
    sync()
    wall = torch.tensor([time.perf_counter() - start], device=dev)
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # the slowest rank's time
    world = dist.get_world_size()
    if rank == 0:
        tokens = world * (a.steps - a.warmup) * a.batch_size * a.seq_len
        print("RESULT " + json.dumps({"side": a.side, "status": "ok", "world": world, "tokens_per_s":
                                      tokens / wall.item(), "loss_last": float(loss),
                                      "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}),
              flush=True)
    dist.destroy_process_group()


def ours(a: argparse.Namespace, side: str, world: int) -> dict:
    from tunebench import RunConfig, run

    strategy = side.removeprefix("ours-")
    rec = run(RunConfig(model="tinygpt-124m", method="full", seq_len=a.seq_len, batch_size=a.batch_size,
                        steps=a.steps, warmup=a.warmup, optimizer="adamw_fused" if a.device == "cuda" else "adamw",
                        grad_clip=1.0, device=a.device, strategy=strategy, nproc_per_node=world, telemetry=False,
                        tag=["vs_plain_ddp"]))
    m = rec.metrics
    return {"side": side, "status": rec.status, "error": rec.error, "world": world, "tokens_per_s": m.tokens_per_s,
            "loss_last": m.loss_last, "compile_scope": m.compile_scope,
            "peak_alloc_gib": m.peak_mem_allocated_bytes / 2**30 if m.peak_mem_allocated_bytes else None}


def run_side(a: argparse.Namespace, side: str, world: int) -> dict:
    """One side at one world size, in processes of its own."""
    shape = ["--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size), "--steps", str(a.steps), "--warmup",
             str(a.warmup), "--device", a.device]
    if side.startswith("plain"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", __file__,
               "--side", side, *shape]
    else:
        cmd = [sys.executable, __file__, "--ours", side, "--world", str(world), *shape]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"side": side, "world": world, "status": "failed", "error": (proc.stderr or proc.stdout)[-3000:]}
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="4", help="world sizes, comma-separated (e.g. 1,4)")
    p.add_argument("--sides", default="plain-ddp,ours-ddp,plain-zero2,ours-zero2", help=f"from {', '.join(SIDES)}")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test with gloo")
    p.add_argument("--out", help="write all figures as JSON here (after every side)")
    p.add_argument("--side", choices=[s for s in SIDES if s.startswith("plain")], help=argparse.SUPPRESS)
    p.add_argument("--ours", choices=[s for s in SIDES if s.startswith("ours")], help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side:
        return plain_rank(a)
    if a.ours:
        print("RESULT " + json.dumps(ours(a, a.ours, a.world)), flush=True)
        return None
    sides = [s.strip() for s in a.sides.split(",") if s.strip()]
    if bad := [s for s in sides if s not in SIDES]:
        p.error(f"unknown side(s) {', '.join(bad)}; choose from {', '.join(SIDES)}")
    results = []
    for world in (int(g) for g in a.gpus.split(",")):
        for side in sides:
            results.append(run_side(a, side, world))
            print(json.dumps(results[-1]), flush=True)
            if a.out:
                tmp = Path(a.out + ".tmp")
                tmp.write_text(json.dumps(results, indent=2))
                tmp.replace(a.out)
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
        one = ok.get((side, 1))
        ratio = f"{tps / plain:10.3f}" if plain and side.startswith("ours") else f"{'':>10}"
        scaling = f"{tps / (world * one):9.1%}" if one and world > 1 else f"{'':>9}"
        print(f"{side:<20}{world:>5}{tps:>12,.0f}{ratio}{scaling}")


if __name__ == "__main__":
    main()
