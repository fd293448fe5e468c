"""`tunebench run` or `tunebench train` with the recorded peak taken apart: what the planner must explain.

    python benchmarks/probes/peak_parts.py run --model llama-3.2-1b --seq-len 1024 --batch-size 4 --grad-accum 2 ...
    python benchmarks/probes/peak_parts.py train --model tinygpt-124m --data corpus.jsonl --eval-fraction 0.02 ...

A run records peak_mem_allocated_bytes as the largest of: the timed steps' allocated peak plus CUDA graphs' pools
counted in full, and the peak before the timed steps (compile, warm-up, the graphs' recording). This prints each
part on a line starting "PEAK PARTS", and for a train job each evaluation's rise of the allocated peak (an
evaluation that raises it is the job's peak, beyond what one step needs). PEAK_PARTS_TRACE=1 records the
allocator's history and lists what the CUDA graphs' pools held at their largest (lines starting "POOL").
"""
import bisect
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
import torch  # noqa: E402

from tunebench import runner  # noqa: E402
from tunebench.metrics import memory  # noqa: E402
from tunebench.trainer import hooks  # noqa: E402

GIB = 1 << 30
TRACED = os.environ.get("PEAK_PARTS_TRACE") == "1" and torch.cuda.is_available()
_peak_memory, _evaluate = runner.peak_memory, hooks.evaluate


def _parts(device: torch.device, graph_pools: bool = False) -> dict:
    out = _peak_memory(device, graph_pools)
    if device.type == "cuda":
        before, _ = memory._before(device)
        steady = torch.cuda.max_memory_allocated(device)
        pools = memory.graph_pool_bytes(device)
        print(f"PEAK PARTS recorded {out['peak_mem_allocated_bytes'] / GIB:.2f} GiB: timed steps' allocated "
              f"{steady / GIB:.2f} + graph pools {pools / GIB:.2f} (counted: {graph_pools}); before the timed steps "
              f"{before / GIB:.2f}; reserved {out['peak_mem_reserved_bytes'] / GIB:.2f}", flush=True)
        if TRACED:
            _pool_at_peak(device)
    return out


def _evaluated(module, prepared, cfg, device, ctx):
    if device.type != "cuda":
        return _evaluate(module, prepared, cfg, device, ctx)
    torch.cuda.synchronize(device)
    before, now = torch.cuda.max_memory_allocated(device), torch.cuda.memory_allocated(device)
    loss = _evaluate(module, prepared, cfg, device, ctx)
    torch.cuda.synchronize(device)
    after = torch.cuda.max_memory_allocated(device)
    print(f"EVAL PARTS allocated at its start {now / GIB:.2f} GiB, peak before {before / GIB:.2f}, after "
          f"{after / GIB:.2f} (rise {(after - before) / GIB:+.2f}; pools {memory.graph_pool_bytes(device) / GIB:.2f})",
          flush=True)
    return loss


def _pool_at_peak(device: torch.device) -> None:
    """PEAK_PARTS_TRACE=1: replay the allocator's history over the graphs' pools' addresses, and list what was
    alive in them at their largest moment, grouped by size and by the line that allocated it."""
    snap = torch.cuda.memory._snapshot()
    pools = sorted((s["address"], s["address"] + s["total_size"]) for s in snap["segments"]
                   if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))
    starts = [lo for lo, _ in pools]
    events = snap["device_traces"][device.index or 0]

    def in_pool(addr: int) -> bool:
        k = bisect.bisect_right(starts, addr) - 1
        return k >= 0 and addr < pools[k][1]

    live, total, peak, at = {}, 0, 0, 0
    for i, e in enumerate(events):
        if e["action"] == "alloc" and in_pool(e["addr"]):
            live[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, at = total, i
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    live = {}
    for e in events[:at + 1]:
        if e["action"] == "alloc" and in_pool(e["addr"]):
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    print(f"POOL pool segments {sum(hi - lo for lo, hi in pools) / GIB:.2f} GiB, alive at their peak "
          f"{peak / GIB:.2f} GiB in {len(live)} blocks (event {at} of {len(events)})", flush=True)
    by_line: dict[str, list[int]] = {}
    for e in live.values():
        frames = [f for f in e.get("frames", []) if "torch/_" not in f["filename"] or "inductor" in f["filename"]]
        where = next((f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames), "?")
        by_line.setdefault(where, []).append(e["size"])
    for where, sizes in sorted(by_line.items(), key=lambda kv: -sum(kv[1]))[:12]:
        print(f"POOL   {sum(sizes) / GIB:6.2f} GiB  {len(sizes):5} blocks, largest {max(sizes) / 2**20:7.1f} MiB  "
              f"{where}", flush=True)
    last = events[at].get("frames", [])[:4]
    print("POOL   the peak's allocation: " + " <- ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}"
                                                         for f in last), flush=True)


if TRACED:
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")  # C++ frames say nothing here
runner.peak_memory, hooks.evaluate = _parts, _evaluated
from tunebench.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
