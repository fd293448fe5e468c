"""tunebench's full fine-tune of GPT-2 small (the `tinygpt-124m` preset) against plain PyTorch on the same job.

The plain side is the short script a user writes (nanoGPT's shape): GPT-2 small with tied weights, GPT-2's
dropout of 0.1 as the preset has it (`plain-nodrop` and `plain-compile-nodrop`: none, as nanoGPT pretrains), SDPA
causal attention, fp32 weights under bf16 autocast, fused AdamW, gradient clipping at 1.0,
`F.cross_entropy` over the logits; eager, or `torch.compile(model)`. Our side is `tunebench.run` with the
same shapes, optimizer and clipping. Each side runs in its own fresh process, one after the other in this one
job on the same GPU; only the steps after `warmup` are timed.

    python benchmarks/compare/vs_plain_gpt.py [--sides plain-compile,ours-model,ours-model-pure,...] [--profile]

`--profile` adds, per side, where the GPU time of 5 steps goes (matmuls, attention, fused Triton kernels,
optimizer, other) from the PyTorch profiler, and the share of the step the GPU sat idle.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

GIB = 1024**3
SIDES = ("plain", "plain-compile", "plain-nodrop", "plain-compile-nodrop", "ours", "ours-blocks", "ours-model",
         "ours-pure", "ours-blocks-pure", "ours-model-pure",  # -pure: precision bf16-pure (bf16 weights, no autocast)
         "ours-model-cudnn", "ours-model-pure-cudnn",  # -cudnn: SDPA's cuDNN kernel first (attn_kernel: cudnn)
         "ours-model-nodrop", "ours-model-pure-nodrop")  # -nodrop: dropout 0 (as plain-compile-nodrop)
VOCAB, LAYERS, HIDDEN, HEADS = 50257, 12, 768, 12


def plain_model(seq_len: int, drop: float):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
            self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
            self.fc, self.out = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
            p = drop if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True).transpose(1, 2).reshape(b, t, c)
            x = x + F.dropout(self.proj(y), p, self.training)
            return x + F.dropout(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")), p, self.training)

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(seq_len, HIDDEN)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f = nn.LayerNorm(HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
            self.head.weight = self.wte.weight
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = F.dropout(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)), drop, self.training)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))

    return GPT()


def plain_train_step(fwd, model, opt, device_type: str, autocast: bool = True) -> Callable:
    """The plain script's step on a batch of ids: bf16 autocast, backward, clipping at 1.0, the optimizer."""
    import torch

    def train(ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
            loss = fwd(ids[:, :-1], ids[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return train


def side_plain(a: argparse.Namespace, compiled: bool, drop: float) -> dict:
    import torch

    torch.manual_seed(0)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = plain_model(a.seq_len, drop).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.0, fused=True)
    fwd = torch.compile(model) if compiled else model
    gen = torch.Generator(device=dev).manual_seed(0)
    train = plain_train_step(fwd, model, opt, dev.type)

    def step() -> torch.Tensor:
        return train(torch.randint(0, VOCAB, (a.batch_size, a.seq_len + 1), generator=gen, device=dev))

    warmup_s, tokens_per_s, loss = bare_loop(step, a, sync)
    out = {"side": "plain" + ("-compile" if compiled else "") + ("" if drop else "-nodrop"), "status": "ok",
           "tokens_per_s": tokens_per_s,
           "peak_alloc_gib": torch.cuda.max_memory_allocated() / GIB if cuda else None, "loss_last": float(loss),
           "warmup_s": warmup_s}
    if a.profile and cuda:
        out["profile"] = profile(step)
    return out


def _cfg(a: argparse.Namespace, scope: str | None, precision: str = "bf16"):
    from tunebench import RunConfig

    return RunConfig(model="tinygpt-124m", method="full", seq_len=a.seq_len, batch_size=a.batch_size, steps=a.steps,
                     warmup=a.warmup, optimizer="adamw_fused", precision=precision, grad_clip=1.0, device=a.device,
                     compile=scope is not None, compile_scope=scope or "auto", telemetry=False, tag=["vs_plain_gpt"])


def side_ours(a: argparse.Namespace, side: str) -> dict:
    from tunebench import run

    kind = side.removesuffix("-nodrop").removesuffix("-cudnn")
    scope = kind.removeprefix("ours").removesuffix("-pure").removeprefix("-") or None
    cfg = _cfg(a, scope, "bf16-pure" if kind.endswith("-pure") else "bf16")
    if side.endswith("-cudnn"):
        cfg = cfg.model_copy(update={"attn_kernel": "cudnn"})
    if side.endswith("-nodrop"):
        cfg = cfg.model_copy(update={"dropout": 0.0})
    rec = run(cfg)
    m = rec.metrics
    out = {"side": side, "status": rec.status, "error": rec.error, "compile_s": m.compile_s,
           "tokens_per_s": m.tokens_per_s, "peak_alloc_gib": m.peak_mem_allocated_bytes / GIB
           if m.peak_mem_allocated_bytes else None, "loss_last": m.loss_last, "setup_s": m.setup_s, "mfu": m.mfu,
           "mfu_noncausal": m.mfu_noncausal}
    if rec.status == "ok" and a.device == "cuda":
        # the harness's overhead: the same step (same kernels, same graphs) in a bare loop, in this process
        step = _our_step(cfg)
        out["bare_tokens_per_s"] = bare_loop(step, a)[1]
        out["harness_overhead"] = 1 - m.tokens_per_s / out["bare_tokens_per_s"]
        if a.profile:
            out["profile"] = profile(step)
    return out


def bare_loop(step: Callable[[], object], a: argparse.Namespace,
              sync: Callable[[], None] | None = None) -> tuple[float, float, object]:
    """`step` run back to back: seconds of the warmup steps, tokens/s of the timed ones between two syncs,
    and what the last step returned."""
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    sync()
    t1 = time.perf_counter()
    for _ in range(a.steps - a.warmup):
        last = step()
    sync()
    return t1 - t0, (a.steps - a.warmup) * a.batch_size * a.seq_len / (time.perf_counter() - t1), last


def _our_step(cfg) -> Callable[[], object]:
    """The same step `run` times, built from the runner's pieces so that the profiler can wrap it."""
    import torch.distributed as dist

    from tunebench.dist import SINGLE, from_env, init_process_group
    from tunebench.engine.step import kernel_settings, optimizer_step_fn
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable, synthetic_data
    from tunebench.strategies import STRATEGIES

    plan = preflight(cfg)
    if not STRATEGIES[plan.cfg.strategy].one_process and not dist.is_initialized():  # one rank (DeepSpeed's too)
        for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                     ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1")):
            os.environ.setdefault(k, v)
        init_process_group(from_env(), plan.device, plan.cfg.timeout)
    t = build_trainable(plan, Outcome(), SINGLE)
    data = synthetic_data(plan, SINGLE)  # a preference objective's pairs as `run` draws them
    step = optimizer_step_fn(t.ts, data, plan.cfg, plan.device, SINGLE)

    def with_kernels() -> object:  # as the runner's loop runs it
        with kernel_settings(plan.cfg, plan.device):
            return step()
    return with_kernels


def _category(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "nvjet", "xmma", "matmul", "sm90_", "cublas")):
        return "matmul"
    if "nccl" in n:  # collectives: on their own stream, overlapping the compute kernels
        return "nccl"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer"
    if n.startswith("triton"):
        return "triton (fused)"
    if "memcpy" in n or "memset" in n:
        return "copy/memset"
    return "other kernels"


PROFILE_WARMUP = 3  # steps run before the profiled ones


def _annotation(name: str) -> bool:
    """A range the profiler also puts on the GPU's timeline (`Optimizer.step#AdamW.step`, `nccl:all_gather`,
    `DistributedDataParallel.forward`): it spans kernels already counted, so adding it would count them twice."""
    return "#" in name or name.startswith(("nccl:", "DistributedDataParallel."))


def profile(step: Callable[[], object], steps: int = 5) -> dict:
    """GPU time per step by kind of kernel, and the share of the step's wall time the GPU was idle (with
    PROFILE_TRACE=FILE in the environment, the whole trace is written there too)."""
    import torch
    from torch.profiler import ProfilerActivity

    for _ in range(PROFILE_WARMUP):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    if os.environ.get("PROFILE_TRACE"):  # a file for chrome://tracing or Perfetto: where the GPU waits, and on what
        prof.export_chrome_trace(os.environ["PROFILE_TRACE"])
    by: dict[str, float] = {}
    top: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type.name != "CUDA" or e.self_device_time_total <= 0 or _annotation(e.key):
            continue
        us = e.self_device_time_total
        by[_category(e.key)] = by.get(_category(e.key), 0.0) + us
        top[e.key[:90]] = top.get(e.key[:90], 0.0) + us
    busy_ms = sum(by.values()) / 1e3 / steps
    compute_ms = busy_ms - by.get("nccl", 0.0) / 1e3 / steps
    wall_ms = wall * 1e3 / steps
    return {"wall_ms": wall_ms, "gpu_busy_ms": busy_ms, "idle_share": max(0.0, 1 - busy_ms / wall_ms),
            "compute_busy_ms": compute_ms, "compute_idle_share": max(0.0, 1 - compute_ms / wall_ms),
            "ms_by_kind": {k: v / 1e3 / steps for k, v in sorted(by.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms": {k: v / 1e3 / steps for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:15]}}


def _child(a: argparse.Namespace, side: str) -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--device", a.device]
    cmd += ["--profile"] if a.profile else []
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"side": side, "status": "failed", "error": (proc.stderr or proc.stdout)[-3000:]}
    return json.loads(lines[-1][len("RESULT "):]) | {"process_s": time.perf_counter() - t0}


def run_side(a: argparse.Namespace, side: str) -> dict:
    if side.startswith("plain"):
        return side_plain(a, compiled="compile" in side, drop=0.0 if side.endswith("nodrop") else 0.1)
    return side_ours(a, side)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, from {', '.join(SIDES)}")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (no memory figures)")
    p.add_argument("--profile", action="store_true", help="also break 5 profiled steps down by kind of kernel")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--out", help="write all figures as JSON here")
    a = p.parse_args()
    if a.side:
        print("RESULT " + json.dumps(run_side(a, a.side)), flush=True)
        return
    sides = [s.strip() for s in a.sides.split(",") if s.strip()]
    bad = [s for s in sides if s not in SIDES]
    if bad:
        p.error(f"unknown side(s) {', '.join(bad)}; choose from {', '.join(SIDES)}")
    results = []
    for side in sides:
        results.append(_child(a, side))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "profile"}), flush=True)
        if a.out:  # after every side, so that a job cut short keeps what it measured
            tmp = Path(a.out + ".tmp")
            tmp.write_text(json.dumps(results, indent=2))
            tmp.replace(a.out)
    _print(a, results)


LOSS_TOLERANCE = 0.02  # last losses of sides training alike (dropout or not, bf16 or bf16-pure) differ by < 0.005


def _print(a: argparse.Namespace, results: list[dict]) -> None:
    ok = {r["side"]: r for r in results if r.get("status") == "ok"}
    print(f"\nGPT-2 small, full, bf16, seq {a.seq_len} batch {a.batch_size} ({a.steps - a.warmup} timed steps "
          f"after {a.warmup})")
    refs = [s for s in ("plain-compile", "plain", "plain-compile-nodrop") if s in ok]
    print(f"{'side':<22}{'status':<8}{'tokens/s':>10}{'peak GiB':>10}{'loss':>9}"
          + "".join(f"{'vs ' + r:>24}" for r in refs))
    for r in results:
        if r.get("status") != "ok":
            print(f"{r['side']:<22}{r.get('status'):<8}  {str(r.get('error', ''))[-600:]}")
            continue
        ratios = "".join(f"{r['tokens_per_s'] / ok[ref]['tokens_per_s']:>24.3f}" for ref in refs)
        gib = r["peak_alloc_gib"] or float("nan")
        mfu = f"   MFU {r['mfu']:.1%} (attention counted whole: {r['mfu_noncausal']:.1%})" if r.get("mfu") else ""
        print(f"{r['side']:<22}{r['status']:<8}{r['tokens_per_s']:>10,.0f}{gib:>10.2f}{r['loss_last']:>9.4f}{ratios}{mfu}")
    # a ratio means nothing if a side does not train as the reference does (same data, seed and updates): whole-model
    # runs once reported speed while their loss never moved (10.979 against 10.883 after 40 steps)
    if refs:
        ref = ok[refs[0]]["loss_last"]
        for r in ok.values():
            if abs(r["loss_last"] - ref) > LOSS_TOLERANCE:
                print(f"WARNING: {r['side']} ends at loss {r['loss_last']:.4f}, {refs[0]} at {ref:.4f}: it does not "
                      f"train the same; its ratio is not a comparison")
    for r in results:
        if r.get("bare_tokens_per_s"):
            print(f"{r['side']}: a bare loop of the same step ran {r['bare_tokens_per_s']:,.0f} tokens/s: the "
                  f"harness costs {r['harness_overhead']:+.1%}")
    print_profiles(results)


def print_profiles(results: list[dict], top: int = 0) -> None:
    """Each profiled side's step by kind of kernel (ms), and its `top` kernels."""
    for r in results:
        prof = r.get("profile")
        if prof:
            kinds = ", ".join(f"{k} {v:.1f}" for k, v in prof["ms_by_kind"].items())
            print(f"{r['side']}: {prof['wall_ms']:.1f} ms/step, GPU busy {prof['gpu_busy_ms']:.1f} ms "
                  f"(idle {prof['idle_share']:.0%}): {kinds}")
            for name, ms in list(prof["top_kernels_ms"].items())[:top]:
                print(f"    {ms:8.2f} ms  {name}")


if __name__ == "__main__":
    main()
