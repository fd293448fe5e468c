"""Where our DDP step's time goes at N GPUs against one: each phase timed by CUDA events on every rank, unprofiled.

Our TinyGPT step is built from the runner's pieces as `run` builds it (`vs_plain_ddp.py`'s config), then run in
variants one after another in this one process (run it under torchrun at each world size):

  base     the step as `run` takes it: forward and backward (DDP all-reducing gradient buckets as they come),
           the update, the loss averaged over ranks
  no-mean  without the loss's all-reduce
  no-sync  without any all-reduce (DDP's `no_sync`, and no loss average): the wrapper's own cost
  bf16     gradients all-reduced in bf16 (DDP's `bf16_compress_hook`; registered last, as it stays)

Per variant and rank: tokens/s over the timed steps, GPU milliseconds per phase between events on the compute
stream (forward + backward, which ends when DDP's last bucket is reduced; update; loss average), and the host's
milliseconds to issue each phase: a phase whose host time reaches its GPU time is paced by the host.
`--trace N`: then N steps of `base` traced (GPU activity only, so the host is barely slowed), rank 0's timeline cut
into compute kernels, NCCL kernels, NCCL time not hidden under compute, and time neither ran.
`--scope model` compiles the model whole under DDP (dynamo cuts its graph where DDP's buckets end); `--bucket-mb`
sets DDP's bucket size (the strategy's BUCKET_MB otherwise).

    torchrun --nproc-per-node 2 benchmarks/probes/ddp_probe.py [--scope model] [--bucket-mb 100] [--out f.json]
    torchrun --nproc-per-node 2 benchmarks/probes/ddp_probe.py --device cpu --seq-len 64 --batch-size 1 --steps 4 \\
        --warmup 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE.parent / "compare"))  # vs_plain_ddp's config and sides

VARIANTS = ("base", "no-mean", "no-sync", "bf16")


def with_buckets(bucket_mb: float) -> None:
    """DDP's bucket size in the runner's strategy set to `bucket_mb` (25 there)."""
    import tunebench.strategies.ddp as ddp_strategy

    plain = ddp_strategy.DistributedDataParallel

    def wrap(*args, **kwargs):
        return plain(*args, **{**kwargs, "bucket_cap_mb": bucket_mb})

    ddp_strategy.DistributedDataParallel = wrap


def probe(a: argparse.Namespace) -> None:
    import torch.distributed as dist

    from tunebench.choices import compile_scope
    from tunebench.dist import from_env, rank_session
    from tunebench.engine.data import SyntheticTokens
    from tunebench.engine.step import kernel_settings
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable
    from vs_plain_ddp import _our_config

    if a.bucket_mb is not None:
        with_buckets(a.bucket_mb)
    ctx = from_env()
    # compiled as asked (auto would leave small shapes and the CPU eager, under either scope's name)
    cfg = _our_config(a, "steps-ddp", ctx.world_size).model_copy(
        update={"compile": a.device == "cuda", "compile_scope": a.scope})
    plan = preflight(cfg, ctx.local_rank)
    dev, cuda = plan.device, plan.device.type == "cuda"
    results = []
    with rank_session(ctx, dev, cfg.timeout), kernel_settings(plan.cfg, dev):
        t = build_trainable(plan, Outcome(), ctx)
        ts = t.ts
        data = SyntheticTokens(plan.spec.vocab_size, cfg.batch_size, cfg.seq_len, dev, cfg.seed, ctx.rank,
                               ctx.world_size)
        for variant in a.variants:
            if variant == "bf16":  # last (checked): the hook stays; the trace is of the step as `run` takes it
                if a.trace and cuda:
                    results.append(trace(a, ts, data, ctx))
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                ts.module.register_comm_hook(None, default_hooks.bf16_compress_hook)
            results.append(run_variant(a, variant, ts, data, ctx, dev, cuda))
            dist.barrier()
        if a.trace and cuda and "bf16" not in a.variants:
            results.append(trace(a, ts, data, ctx))
        scope = compile_scope(plan.cfg, plan.strategy)
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, results)
        if ctx.rank == 0:
            report(a, scope, everyone)
        dist.barrier()


def mark(points: list | None, event) -> None:
    """A point in a timed step (`points` None: not timed): an event on the compute stream, and the host's time."""
    if points is not None:
        e = event() if event else None
        if e:
            e.record()
        points.append((e, time.perf_counter()))


def run_variant(a, variant: str, ts, data, ctx, dev, cuda: bool) -> dict:
    import torch
    import torch.distributed as dist

    sync, mean = variant != "no-sync", variant not in ("no-sync", "no-mean")
    event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else None
    marks: list[list] = []  # per timed step: [(event, host time)] at 4 points
    for i in range(a.steps):
        if i == a.warmup:
            torch.cuda.synchronize() if cuda else None
            dist.barrier()
            start = time.perf_counter()
        points: list | None = [] if i >= a.warmup else None
        mark(points, event)
        loss = ts.micro(data.next(), sync)
        mark(points, event)
        ts.update()
        mark(points, event)
        if mean:
            ctx.mean(loss)
        mark(points, event)
        if points is not None:
            marks.append(points)
    torch.cuda.synchronize() if cuda else None
    wall = time.perf_counter() - start
    n = a.steps - a.warmup
    phases = ("fwd+bwd", "update", "mean")
    out = {"variant": variant, "rank": ctx.rank, "world": ctx.world_size, "wall_ms_per_step": 1e3 * wall / n,
           "tokens_per_s": a.batch_size * a.seq_len * n / wall}
    for k, name in enumerate(phases):
        out[f"host_ms:{name}"] = statistics.mean(1e3 * (p[k + 1][1] - p[k][1]) for p in marks)
        if cuda:
            out[f"gpu_ms:{name}"] = statistics.mean(p[k][0].elapsed_time(p[k + 1][0]) for p in marks)
    if cuda:  # from one step's first event to the next step's: the GPU's step time as its stream sees it
        out["gpu_ms:step"] = statistics.mean(marks[j][0][0].elapsed_time(marks[j + 1][0][0])
                                            for j in range(len(marks) - 1))
    return out


def trace(a: argparse.Namespace, ts, data, ctx) -> dict:
    """`a.trace` base steps with the GPU's kernels traced; per step: wall, compute busy, NCCL busy, NCCL exposed
    (not under any compute kernel), idle (neither running)."""
    import torch
    from torch.profiler import ProfilerActivity

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.trace):
            loss = ts.micro(data.next(), True)
            ts.update()
            ctx.mean(loss)
        torch.cuda.synchronize()
    kernels = [(e.start_ns(), e.start_ns() + e.duration_ns(), "nccl" in e.name().lower())
               for e in prof.profiler.kineto_results.events() if e.device_type().name == "CUDA"
               and e.duration_ns() > 0 and not e.name().startswith(("Memcpy", "Memset"))]
    compute = union([(s, e) for s, e, nccl in kernels if not nccl])
    comm = union([(s, e) for s, e, nccl in kernels if nccl])
    wall = max(e for _, e, _ in kernels) - min(s for s, _, _ in kernels)
    both = union(compute + comm)
    ms = lambda ns: ns / 1e6 / a.trace  # noqa: E731  per step
    return {"variant": "trace", "rank": ctx.rank, "world": ctx.world_size, "wall_ms_per_step": ms(wall),
            "tokens_per_s": 0.0, "compute_ms": ms(length(compute)), "nccl_ms": ms(length(comm)),
            "nccl_exposed_ms": ms(length(both) - length(compute)), "idle_ms": ms(wall - length(both))}


def union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(spans: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in spans)


def report(a: argparse.Namespace, scope: str | None, everyone: list[list[dict]]) -> None:
    from tunebench.strategies.ddp import BUCKET_MB

    traced = [r for per_rank in everyone for r in per_rank if r["variant"] == "trace"]
    rows = [r for per_rank in everyone for r in per_rank if r["variant"] != "trace"]
    keys = [k for k in rows[0] if k.startswith(("host_ms", "gpu_ms", "wall"))]
    print(f"scope={scope or 'eager'} bucket_mb={a.bucket_mb or BUCKET_MB} world={rows[0]['world']}")
    print(f"{'variant':<9}{'rank':>5}{'tok/s/GPU':>11}" + "".join(f"{k:>18}" for k in keys))
    for r in rows:
        print(f"{r['variant']:<9}{r['rank']:>5}{r['tokens_per_s']:>11,.0f}" + "".join(f"{r[k]:>18.2f}" for k in keys))
    for r in traced:
        print(f"traced   {r['rank']:>5}  per step: wall {r['wall_ms_per_step']:.2f} ms, compute {r['compute_ms']:.2f}, "
              f"NCCL {r['nccl_ms']:.2f} (exposed {r['nccl_exposed_ms']:.2f}), idle {r['idle_ms']:.2f}")
    if a.out:
        tmp = Path(a.out + ".tmp")
        tmp.write_text(json.dumps({"scope": scope, "bucket_mb": a.bucket_mb, "rows": rows + traced},
                                  indent=1))
        tmp.replace(a.out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--scope", default="blocks", choices=("blocks", "model"))
    p.add_argument("--bucket-mb", type=float)
    p.add_argument("--trace", type=int, default=0, help="then this many steps traced (GPU kernels only)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"from {', '.join(VARIANTS)} (bf16 last)")
    p.add_argument("--out", help="write every rank's figures as JSON here")
    a = p.parse_args()
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if bad := [v for v in a.variants if v not in VARIANTS]:
        p.error(f"unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    if "bf16" in a.variants[:-1]:
        p.error("bf16 goes last: its hook stays registered for every step after it")
    if a.steps - a.warmup < 2:
        p.error("--steps must exceed --warmup by 2 or more (a step's time is between two timed steps)")
    if a.scope == "model" and a.bucket_mb is not None and a.bucket_mb < 1:
        p.error("--bucket-mb below 1 with --scope model: dynamo's cut wants DDP's first bucket (1 MiB) no larger")
    probe(a)


if __name__ == "__main__":
    main()
