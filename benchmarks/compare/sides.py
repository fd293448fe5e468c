"""What the scripts that run a plain reference and tunebench side by side share (vs_plain_ddp, vs_plain_fsdp).

Each side runs in processes of its own (a plain side under torchrun, our side through `tunebench.run`, which
starts its own), one after the other in one job; a side prints one `RESULT {json}` line, and every figure is saved
after each side, so a job cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser, sides: tuple[str, ...], default_sides: str) -> None:
    """The options every such script takes, and the hidden ones a side's own process is started with."""
    p.add_argument("--sides", default=default_sides, help=f"from {', '.join(sides)}")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test with gloo")
    p.add_argument("--side-timeout", type=float, default=420, help="seconds one side may take, start-up included")
    p.add_argument("--out", help="write all figures as JSON here (after every side)")
    p.add_argument("--side", choices=sides, help=argparse.SUPPRESS)  # a rank under torchrun
    p.add_argument("--ours", choices=[s for s in sides if s.startswith("ours")], help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)


def chosen(p: argparse.ArgumentParser, a: argparse.Namespace, sides: tuple[str, ...]) -> list[str]:
    names = [s.strip() for s in a.sides.split(",") if s.strip()]
    if bad := [s for s in names if s not in sides]:
        p.error(f"unknown side(s) {', '.join(bad)}; choose from {', '.join(sides)}")
    return names


def as_side_process(a: argparse.Namespace, plain_rank: Callable[[argparse.Namespace], None],
                    ours: Callable[[argparse.Namespace, str, int], dict]) -> bool:
    """In a side's own process: run that side (True); in the parent, do nothing (False)."""
    if a.side:
        plain_rank(a)
        return True
    if a.ours:
        print("RESULT " + json.dumps(ours(a, a.ours, a.world)), flush=True)
        return True
    return False


def run_side(script: str, side: str, world: int, shape: list[str], timeout: float, torchrun: bool = False) -> dict:
    """One side at one world size, in processes of its own; its whole process group ended past `timeout`.
    Plain sides (and ours when `torchrun`) run their ranks under torchrun; ours otherwise goes through
    `tunebench.run`, which starts its own."""
    if side.startswith("plain") or torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", script,
               "--side", side, *shape]
    else:
        cmd = [sys.executable, script, "--ours", side, "--world", str(world), *shape]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return {"side": side, "world": world, "status": "timeout", "error": (err or out)[-3000:]}
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"side": side, "world": world, "status": "failed", "error": (err or out)[-3000:]}
    result = json.loads(lines[-1][len("RESULT "):])
    if proc.returncode:  # measured, then died tearing down (gloo on the CPU aborts at exit now and then): kept
        result["exit_code"] = proc.returncode
    return result


def save(out: str | None, results: list[dict]) -> None:
    """Every figure so far, written aside and renamed into place."""
    print(json.dumps(results[-1]), flush=True)
    if out:
        tmp = Path(out + ".tmp")
        tmp.write_text(json.dumps(results, indent=2))
        tmp.replace(out)


def start_rank(device: str):
    """Under torchrun: this rank's device, its process group started."""
    import torch
    import torch.distributed as dist

    cuda = device == "cuda"
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
    return dev


def timed_rank(a: argparse.Namespace, dev, train: Callable, vocab: int, row_len: int,
               profile_steps: int = 0) -> None:
    """`a.steps` steps of `train(ids)` on random rows of `row_len` tokens (this rank's own), those after `a.warmup`
    timed; tokens/s is every rank's tokens over the slowest rank's time, printed by rank 0. `profile_steps`: then
    that many more steps, rank 0's under the PyTorch profiler (GPU time by kind of kernel, idle share)."""
    import torch
    import torch.distributed as dist

    cuda, rank, world = dev.type == "cuda", dist.get_rank(), dist.get_world_size()
    gen = torch.Generator(device=dev).manual_seed(rank)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for i in range(a.steps):
        if i == a.warmup:
            sync()
            dist.barrier()
            start = time.perf_counter()
        loss = train(torch.randint(0, vocab, (a.batch_size, row_len), generator=gen, device=dev))
    sync()
    wall = torch.tensor([time.perf_counter() - start], device=dev)
    dist.all_reduce(wall, op=dist.ReduceOp.MAX)
    result = {"side": a.side, "status": "ok", "world": world,
              "tokens_per_s": world * (a.steps - a.warmup) * a.batch_size * a.seq_len / wall.item(),
              "loss_last": float(loss.detach()),
              "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
    result["tokens_per_s_per_gpu"] = result["tokens_per_s"] / world
    if profile_steps and cuda:
        from vs_plain_gpt import PROFILE_WARMUP, profile

        def step() -> object:
            return train(torch.randint(0, vocab, (a.batch_size, row_len), generator=gen, device=dev))

        if rank == 0:
            result["profile"] = profile(step, profile_steps)
        else:  # the same steps, in step with rank 0's collectives
            for _ in range(PROFILE_WARMUP + profile_steps):
                step()
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()  # no rank tears its group down while another still reads its result
    dist.destroy_process_group()


def our_rank(a: argparse.Namespace, config: Callable[[int], object], profile_steps: int) -> None:
    """One rank of our side under torchrun: our engine's step built from the runner's pieces as `run` builds it
    (`config(world size)` its RunConfig), its batches the engine's own, timed and profiled as a plain side is:
    the engine without the harness around it."""
    from tunebench.dist import from_env, rank_session
    from tunebench.engine.data import SyntheticTokens
    from tunebench.engine.step import kernel_settings, optimizer_step_fn
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable

    ctx = from_env()
    cfg = config(ctx.world_size)
    plan = preflight(cfg, ctx.local_rank)
    with rank_session(ctx, plan.device, cfg.timeout):
        t = build_trainable(plan, Outcome(), ctx)
        data = SyntheticTokens(plan.spec.vocab_size, cfg.batch_size, cfg.seq_len, plan.device, cfg.seed, ctx.rank,
                               ctx.world_size)
        step = optimizer_step_fn(t.ts, data, plan.cfg, plan.device, ctx)

        def train(_ids: object) -> object:  # as the runner's loop runs it
            with kernel_settings(plan.cfg, plan.device):
                return step()

        timed_rank(a, plan.device, train, 2, 1, profile_steps)
