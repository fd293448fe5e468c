"""All-reduce, all-gather and reduce-scatter across the local GPUs (NCCL) or CPU processes (gloo).

Measured as nccl-tests measures them: out-of-place, float32, `warmup` untimed calls, then `iters`
calls back to back with one synchronisation at the end; the time of one call is that span over
`iters`, averaged over the ranks. The size of a test is the larger buffer: the one buffer of an
all-reduce, the output of an all-gather, the input of a reduce-scatter. Then (nccl-tests'
PERFORMANCE.md):

    algbw = size / time
    busbw = algbw x 2(n-1)/n   for all-reduce
    busbw = algbw x (n-1)/n    for all-gather and reduce-scatter

busbw is what each GPU's link carried, comparable across n and against the hardware's bandwidth.
The ranks are started by torchrun; each runs `python -m tunebench.hw.worker RUNDIR`.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

OPS = ("all_reduce", "all_gather", "reduce_scatter")
# torch 2.13 renamed the flat-tensor forms (the old names warn); 2.11 on the GPU machines has only the old.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
WORD = 4  # float32, nccl-tests' default type


def bus_factor(op: str, n: int) -> float:
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def bandwidths(op: str, size_bytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) for one call of `op` on `size_bytes` taking `seconds`."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, n)


def sizes(min_bytes: int, max_bytes: int, step: int = 2) -> list[int]:
    """min, min x step, ... up to max (always included)."""
    out, s = [], min_bytes
    while s < max_bytes:
        out.append(s)
        s *= step
    return out + [max_bytes]


def _call(op: str, size: int, n: int, device: torch.device):
    count = max(n, size // WORD // n * n)  # divisible by the ranks, as every op needs
    # Zeros: repeated all-reduces of anything else would grow to inf (harmless, but odd to leave).
    big = torch.zeros(count, dtype=torch.float32, device=device)
    small = torch.zeros(count // n, dtype=torch.float32, device=device)
    if op == "all_reduce":  # torch's all-reduce is in place; NCCL runs in- and out-of-place at the same speed
        return lambda: dist.all_reduce(big), count * WORD
    if op == "all_gather":
        return lambda: ALL_GATHER(big, small), count * WORD
    return lambda: REDUCE_SCATTER(small, big), count * WORD


def measure(device: torch.device, sizes_: list[int], iters: int, warmup: int) -> list[dict]:
    """On every rank: each op at each size; rank-averaged time per call, algbw and busbw."""
    n = dist.get_world_size()
    # NCCL sets up its channels and protocols on the first calls: do that before any size is timed.
    for op in OPS:
        for size in (sizes_[0], sizes_[-1]):
            call, _ = _call(op, size, n, device)
            for _ in range(warmup):
                call()
            del call
    _sync(device)
    rows = []
    for op in OPS:
        for size in sizes_:
            call, real = _call(op, size, n, device)
            for _ in range(warmup):
                call()
            _sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            _sync(device)
            t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
            dist.all_reduce(t)
            seconds = t.item() / n
            algbw, busbw = bandwidths(op, real, seconds, n)
            rows.append({"op": op, "bytes": real, "time_us": seconds * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw})
            del call
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(device_type: str, nproc: int, sizes_: list[int], iters: int, warmup: int, timeout: float,
        with_telemetry: bool) -> dict:
    """Start `nproc` ranks with torchrun on this node and return rank 0's result; raises on failure."""
    from tunebench.launch.processes import run_torchrun, torchrun_env
    from tunebench.launch.rundir import RunDir

    with RunDir.temporary("tunebench-hw-") as rundir:
        rundir.write_job({"device": device_type, "sizes": sizes_, "iters": iters, "warmup": warmup,
                          "timeout": timeout, "telemetry": with_telemetry})
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                "--max-restarts=0", "--monitor-interval=0.5", "-m", "tunebench.hw.worker", str(rundir.path)]
        code, tail = run_torchrun(argv, torchrun_env(nproc, device_type == "cpu"), timeout=timeout + 120)
        text = rundir.result()
        if code != 0 or text is None:
            raise RuntimeError(f"collectives failed (exit code {code}):\n" + "".join(tail)[-3000:])
        return json.loads(text)

