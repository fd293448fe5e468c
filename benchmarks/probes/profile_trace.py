"""One tunebench configuration's step profiled, its trace written for reading where the GPU waits.

    PROFILE_TRACE=trace.json python benchmarks/probes/profile_trace.py --model mistral-7b --method qlora \\
        --seq-len 512 --batch-size 8 --no-grad-ckpt --optimizer paged_adamw_8bit
    python benchmarks/probes/profile_trace.py --gaps trace.json   # the GPU's idle time, by the host op it waited on,
                                                                  # and the host's CUDA calls
    python benchmarks/probes/profile_trace.py --host --model tinygpt-124m --seq-len 512 --batch-size 1  # the host
    (HOST_CPROFILE=0: the step's times without the Python profile after them)

Any `tunebench run` option is taken (RunConfig's fields). The step is built from the runner's pieces as `run` builds
it (vs_plain_gpt._our_step); 3 steps run first, then 5 are profiled.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compare"))  # vs_plain_gpt's step and profiler

GAP_US = 20  # shorter gaps between kernels are launch latency, not waiting on the host
# kernels are launched through the runtime (aten's) or the driver (Triton's, inductor's: cuLaunchKernel)
LAUNCHES = ("cuda_runtime", "cuda_driver")


def gaps(path: str, top: int = 25) -> None:
    """Where the GPU sat idle: each gap between kernels longer than GAP_US, charged to the host ops running on
    the thread that launched the next kernel, at its launch (forward on the main thread, backward on autograd's)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})}
    ops: dict[object, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            ops[e["tid"]].append(e)
    charged: dict[str, float] = defaultdict(float)
    total = 0.0
    end = kernels[0]["ts"] + kernels[0]["dur"]
    for k in kernels[1:]:
        gap = k["ts"] - end
        if gap > GAP_US:
            launch = launches.get(k["args"].get("correlation"))
            inner = [] if launch is None else sorted(
                (o for o in ops[launch["tid"]] if o["ts"] <= launch["ts"] <= o["ts"] + o["dur"]),
                key=lambda o: o["ts"])
            names = " > ".join(o["name"][:40] for o in inner[-3:]) or "(no host op)"
            charged[names] += gap
            total += gap
        end = max(end, k["ts"] + k["dur"])
    span = end - kernels[0]["ts"]
    busy = sum(k["dur"] for k in kernels)
    print(f"GPU idle in gaps over {GAP_US} us: {total / 1e3:.1f} ms of {span / 1e3:.1f} ms traced; "
          f"{len(kernels)} kernels and copies, busy {busy / 1e3:.1f} ms")
    for name, us in sorted(charged.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{us / 1e3:9.2f} ms  {name}")
    # the host's own calls into CUDA: two processes of one configuration compared call by call say whether the
    # host itself ran slower (every call longer) or waited (its synchronizations longer)
    calls: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("cat") in LAUNCHES and e.get("ph") == "X":
            calls[e["name"]] += e["dur"]
    print("host's CUDA calls: " + ", ".join(f"{name} {us / 1e3:.1f} ms" for name, us in
                                             sorted(calls.items(), key=lambda kv: -kv[1])[:8]))


def host(step, steps: int = 20, top: int = 25) -> None:
    """The host's side of `steps` steps, without the CUDA profiler: wall and GPU time a step (CUDA events), then
    the Python functions that took the host's time (cProfile, by own time)."""
    import cProfile
    import pstats
    import time

    import torch

    from vs_plain_gpt import PROFILE_WARMUP

    for _ in range(PROFILE_WARMUP + 3):  # compiled, and CUDA graphs recorded
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(steps):
        step()
    end.record()
    issued = time.perf_counter() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    print(f"{wall / steps * 1e3:.2f} ms a step, host issued it in {issued / steps * 1e3:.2f} ms "
          f"(the GPU's span {start.elapsed_time(end) / steps:.2f} ms)")
    if os.environ.get("HOST_CPROFILE") == "0":  # the step's times alone
        return
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> None:
    if sys.argv[1:2] == ["--gaps"]:
        return gaps(sys.argv[2])
    from vs_plain_gpt import _our_step, profile

    if sys.argv[1:2] == ["--host"]:
        return host(_our_step(config_from_args(sys.argv[2:])))
    p = profile(_our_step(config_from_args(sys.argv[1:])))
    print(json.dumps(p))


def config_from_args(args: list[str]):
    """A RunConfig from `tunebench run`-style options (--name value, --flag, --no-flag), on the GPU unless told."""
    from tunebench.config import RunConfig

    fields: dict[str, object] = {"device": "cuda"}
    i = 0
    while i < len(args):
        name = args[i].removeprefix("--").replace("-", "_")
        if name.startswith("no_"):
            fields[name[3:]], i = False, i + 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            fields[name], i = args[i + 1], i + 2
        else:
            fields[name], i = True, i + 1
    return RunConfig(**fields)


if __name__ == "__main__":
    main()
