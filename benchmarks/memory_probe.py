"""Where a training step's memory goes, phase by phase, on one GPU: the planner's ground truth.

For each configuration (key=value pairs, as `tunebench run --set` takes them) this builds the model
exactly as `tunebench run` does, runs two warm steps, then measures one step: allocated bytes before
the forward, after it and at its peak, at the backward's peak and after it, at the optimizer's peak,
and the bytes autograd saved per transformer block (unique storages, parameters excluded). One JSON
line per configuration goes to stdout and to --out.

    python benchmarks/memory_probe.py --out probe.jsonl "model=tinygpt-124m batch_size=8 seq_len=2048" ...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from tunebench.config import RunConfig
from tunebench.dist import DistContext
from tunebench.engine.data import SyntheticTokens
from tunebench.metrics.memory import release
from tunebench.run_preflight import preflight
from tunebench.runner import Outcome, build_trainable


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


def probe(pairs: dict[str, str]) -> dict:
    cfg = RunConfig(**pairs)
    plan = preflight(cfg)
    ctx = DistContext()
    out = Outcome()
    t = build_trainable(plan, out, ctx)
    dev = plan.device
    data = SyntheticTokens(plan.spec.vocab_size, cfg.batch_size, cfg.seq_len, dev, cfg.seed)
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
    phases = []
    for k in range(cfg.grad_accum):
        saved.per_block.clear()  # the last micro-batch's
        batch = data.next()
        sync_dev()
        reset()
        ph: dict = {"before_fwd": alloc()}
        t0 = time.perf_counter()
        module = ts.module
        sync = k == cfg.grad_accum - 1
        if hasattr(module, "backward") and hasattr(module, "step"):  # DeepSpeed engine
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda x: x):
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

            ctxm = torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda x: x)
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
    args = ap.parse_args()
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
        pairs = dict(kv.split("=", 1) for kv in text.split())
        pairs.setdefault("steps", "3")
        pairs.setdefault("warmup", "1")
        pairs.setdefault("nproc_per_node", "1")
        started = time.perf_counter()
        try:
            res = probe(pairs)
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
