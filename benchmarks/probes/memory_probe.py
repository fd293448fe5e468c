"""Where a training step's memory goes, phase by phase, on one GPU: the planner's ground truth.

For each configuration (key=value pairs, as `tunebench run --set` takes them) this builds the model
exactly as `tunebench run` does, runs two warm steps, then measures one step: allocated bytes before
the forward, after it and at its peak, at the backward's peak and after it, at the optimizer's peak,
and the bytes autograd saved per transformer block (unique storages, parameters excluded). One JSON
line per configuration goes to stdout and to --out. With --peak-live (CUDA) the measured step also runs under the
allocator's history: the step's largest moment is replayed from it, and what was allocated in the step and still
alive then is listed, grouped by size and by the Python line that allocated it (what a planner item must explain).

    python benchmarks/probes/memory_probe.py --out probe.jsonl "model=tinygpt-124m batch_size=8 seq_len=2048" ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from tunebench.config import RunConfig
from tunebench.dist import DistContext
from tunebench.metrics.memory import release
from tunebench.run_preflight import preflight
from tunebench.runner import Outcome, build_trainable, synthetic_data


class SavedBytes:
    """Bytes autograd keeps for backward, per transformer block (the block running when it was saved)."""

    def __init__(self, blocks: torch.nn.ModuleList, params: set[int]):
        self.current = -1
        self.per_block: dict[int, dict[int, int]] = {}
        self.params = params
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda m, a, i=i: setattr(self, "current", i))
            block.register_forward_hook(lambda m, a, o: setattr(self, "current", -1))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            st = t.untyped_storage()
            if st.data_ptr() not in self.params:
                self.per_block.setdefault(self.current, {})[st.data_ptr()] = st.nbytes()
        return t

    def totals(self) -> dict[int, int]:
        return {k: sum(v.values()) for k, v in self.per_block.items()}


KINDS = (("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_")),
         ("attention", ("flash", "fmha", "attention", "cudnn")),
         ("comm", ("nccl",)))


def kernel_profile(ts, data, cfg) -> dict[str, float]:
    """GPU time of one more step by kernel kind (matmul, attention, comm, other), in milliseconds."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for k in range(cfg.grad_accum):
            ts.micro(data.next(), k == cfg.grad_accum - 1)
        ts.update()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)
        if not us or e.key.startswith(("ProfilerStep", "aten::")):
            continue
        name = e.key.lower()
        kind = next((k for k, pats in KINDS if any(p in name for p in pats)), "other")
        out[kind] = out.get(kind, 0.0) + us / 1000
    return out


def _where(frames: list[dict]) -> str:
    """The line that asked for a block: the first frame outside torch's own modules (inductor's generated code,
    a model's forward, our engine), with the tunebench frame beneath it where that is a different one."""
    def own(f: dict) -> bool:
        name = f.get("filename", "")
        return "/torch/" not in name or "torchinductor" in name

    first = next((f for f in frames if own(f)), frames[0] if frames else {})
    ours = next((f for f in frames if "tunebench" in f.get("filename", "")), None)
    text = lambda f: f"{os.path.basename(f.get('filename', '?'))}:{f.get('line', 0)} {f.get('name', '')}"  # noqa: E731
    return text(first) + (f" < {text(ours)}" if ours and ours is not first else "")


def live_at_peak(snapshot: dict, start_bytes: int, top: int = 40) -> dict:
    """Replay the allocator's history of one step: the largest moment, and the blocks allocated since the history
    began and alive then, grouped by (size, where). `start_bytes`: allocated when the history began."""
    events = [e for e in snapshot["device_traces"][0] if e["action"] in ("alloc", "free_completed")]
    live: dict[int, dict] = {}
    now = best = start_bytes
    best_live: dict[int, dict] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            now += e["size"]
            if now > best:
                best, best_live = now, dict(live)
        else:
            gone = live.pop(e["addr"], None)
            now -= gone["size"] if gone else e["size"]
    groups: dict[tuple[int, str], list[int]] = {}
    by_line: dict[str, int] = {}  # every block at the peak, by the line of ours (or the model's) that asked for it
    for e in best_live.values():
        where = _where(e.get("frames", []))
        groups.setdefault((e["size"], where), []).append(e["size"])
        line = where.split(" < ")[-1]
        by_line[line] = by_line.get(line, 0) + e["size"]
    rows = sorted(((sum(v), len(v), size, where) for (size, where), v in groups.items()), reverse=True)
    return {"peak": best, "before": start_bytes, "new_at_peak": sum(e["size"] for e in best_live.values()),
            "groups": [{"bytes": b, "count": n, "size": size, "where": where} for b, n, size, where in rows[:top]],
            "by_line": dict(sorted(by_line.items(), key=lambda kv: -kv[1]))}


def probe(pairs: dict[str, str], peak_live: bool = False) -> dict:
    plan = preflight(RunConfig(**pairs))
    cfg = plan.cfg  # 'auto' made concrete, as a run's step sees it (precision=auto would autocast to fp16 here)
    ctx = DistContext()
    out = Outcome()
    t = build_trainable(plan, out, ctx)
    dev = plan.device
    data = synthetic_data(plan, ctx)
    ts = t.ts
    cuda = dev.type == "cuda"
    alloc = lambda: torch.cuda.memory_allocated(dev) if cuda else 0  # noqa: E731
    peak = lambda: torch.cuda.max_memory_allocated(dev) if cuda else 0  # noqa: E731
    sync_dev = torch.cuda.synchronize if cuda else (lambda: None)
    reset = (lambda: torch.cuda.reset_peak_memory_stats(dev)) if cuda else (lambda: None)
    from tunebench.engine.model import transformer_blocks

    blocks = transformer_blocks(t.model, plan.spec.num_layers)
    params = set()
    for p in t.module.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p  # FSDP2 parameters are DTensors
        params.add(local.untyped_storage().data_ptr())
    res: dict = {"config": pairs, "after_build": alloc()}
    for _ in range(2):
        for k in range(cfg.grad_accum):
            ts.micro(data.next(), k == cfg.grad_accum - 1)
        ts.update()
    sync_dev()
    res["steady_before_step"] = alloc()
    saved = SavedBytes(blocks, params)
    # the saved-tensor hooks count bytes per block; left out where the step's own memory is recorded (a hook can
    # change what a compiled graph keeps)
    hooks = (lambda: contextlib.nullcontext()) if peak_live else (  # noqa: E731
        lambda: torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda x: x))
    phases = []
    history_from = 0
    for k in range(cfg.grad_accum):
        saved.per_block.clear()  # the last micro-batch's
        if peak_live and cuda and k == cfg.grad_accum - 1:
            sync_dev()
            history_from = alloc()
            torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
        batch = data.next()
        sync_dev()
        reset()
        ph: dict = {"before_fwd": alloc()}
        t0 = time.perf_counter()
        module = ts.module
        sync = k == cfg.grad_accum - 1
        if hasattr(module, "backward") and hasattr(module, "step"):  # DeepSpeed engine
            with hooks():
                loss = module(*batch)
            sync_dev()
            ph |= {"after_fwd": alloc(), "peak_fwd": peak(), "fwd_s": time.perf_counter() - t0}
            t0 = time.perf_counter()
            reset()
            module.backward(loss)
            sync_dev()
            ph |= {"after_bwd": alloc(), "peak_bwd": peak(), "bwd_s": time.perf_counter() - t0}
            t0 = time.perf_counter()
            reset()
            module.step()
        else:
            from tunebench.engine.step import autocast

            ctxm = hooks()
            nosync = module.no_sync() if (not sync and hasattr(module, "no_sync")) else None
            if nosync:
                nosync.__enter__()
            with ctxm, autocast(cfg, dev):
                loss = module(*batch) / cfg.grad_accum
            sync_dev()
            ph |= {"after_fwd": alloc(), "peak_fwd": peak(), "fwd_s": time.perf_counter() - t0}
            t0 = time.perf_counter()
            reset()
            loss.backward()
            if nosync:
                nosync.__exit__(None, None, None)
            sync_dev()
            ph |= {"after_bwd": alloc(), "peak_bwd": peak(), "bwd_s": time.perf_counter() - t0}
            t0 = time.perf_counter()
            reset()
            if sync:
                ts.update()
        sync_dev()
        ph |= {"after_step": alloc(), "peak_step": peak(), "step_s": time.perf_counter() - t0}
        phases.append(ph)
    res["phases"] = phases
    if peak_live and cuda:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        res["live_at_peak"] = live_at_peak(snap, history_from)
    if cuda:
        from tunebench.metrics.memory import nvml_used_bytes

        res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
        res["nvml_used"] = nvml_used_bytes(dev)
    if cuda:
        res["kernel_ms"] = kernel_profile(ts, data, cfg)
    per_block = saved.totals()
    res["saved_per_block"] = [per_block.get(i, 0) for i in range(len(blocks))]
    res["saved_outside_blocks"] = per_block.get(-1, 0)
    res["tokens"] = cfg.batch_size * cfg.seq_len
    res["params_total"], res["params_trainable"] = out.params_total, out.params_trainable
    del t, ts, data
    release(dev)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+", help='"key=value key=value ..." per configuration')
    ap.add_argument("--out", default=None)
    ap.add_argument("--peak-live", action="store_true", help="list what is alive at the step's largest moment (CUDA)")
    args = ap.parse_args()
    if len(args.configs) > 1:  # each in a process of its own: a DeepSpeed engine outlives its probe (its memory too)
        flags = (["--out", args.out] if args.out else []) + (["--peak-live"] if args.peak_live else [])
        for text in args.configs:
            subprocess.run([sys.executable, __file__, *flags, text], check=False)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)  # DeepSpeed reads them
    cuda = torch.cuda.is_available()  # the CPU path only checks the script itself
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1, **({"device_id": device} if cuda else {}))
    for text in args.configs:
        pairs = dict(kv.split("=", 1) for kv in text.split())  # a list's items comma-separated, as the CLI's flags
        pairs = {k: v.split(",") if "," in v else v for k, v in pairs.items()}
        pairs.setdefault("steps", "3")
        pairs.setdefault("warmup", "1")
        pairs.setdefault("nproc_per_node", "1")
        started = time.perf_counter()
        try:
            res = probe(pairs, args.peak_live)
        except Exception as err:  # one failing configuration must not hide the others
            res = {"config": pairs, "error": f"{type(err).__name__}: {str(err)[:500]}"}
            release(device)
        res["seconds"] = round(time.perf_counter() - started, 1)
        line = json.dumps(res)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
