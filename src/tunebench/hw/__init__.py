"""`tunebench hw`: what the machine can do, measured, so that training figures have a bar to meet.

host (one thread's kernel launches) -> matmul (MAMF per dtype) -> bandwidth (device copy, host <-> device) ->
collectives (across local GPUs, or CPU processes with gloo). Each section that fails is named in the record with its
error; the others keep their figures. GPU telemetry is sampled over the whole command.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from tunebench.config import HwConfig
from tunebench.console import say
from tunebench.environment import environment
from tunebench.errors import invalid
from tunebench.hw import bandwidth, collectives, host, matmul
from tunebench.metrics import telemetry
from tunebench.metrics.flops import peak_flops
from tunebench.preflight import Plan, resolve_device
from tunebench.record import HwMetrics, ResultRecord, RunTelemetry

Log = Callable[[str], None]


def preflight(cfg: HwConfig) -> Plan:
    device = resolve_device(cfg.device)
    for d in cfg.dtypes or []:
        if device.type == "cpu" and d in ("tf32", "fp8"):
            raise invalid("dtypes", d, "TF32 and FP8 matmuls need a CUDA GPU (use fp32, bf16 or fp16 on CPU)")
        if d == "fp8" and not matmul.has_fp8(device):
            raise invalid("dtypes", d, "this GPU has no FP8 tensor cores (compute capability 8.9 or newer needed)")
    return Plan(cfg, device)


def run_hw(cfg: HwConfig, log: Log = say) -> ResultRecord:
    device = preflight(cfg).device
    env = environment(device)
    m = HwMetrics(device_name=env["gpu"]["name"] or env["cpu"]["model"])
    started = time.perf_counter()
    sampler = telemetry.start(device, cfg.telemetry)
    for section in cfg.sections:
        log(f"hw: {section} on {m.device_name}")
        try:
            m.sections[section] = {"host": _host, "matmul": _matmul, "bandwidth": _bandwidth,
                                   "collectives": _collectives}[section](cfg, device, m, log)
        except Exception as err:  # a section that fails is a result; the others still count
            m.sections[section] = f"failed: {type(err).__name__}: {str(err).strip()[-2000:]}"
            log(f"hw: {section} failed: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    m.telemetry = sampler.stop() if sampler else None
    m.wall_s = time.perf_counter() - started
    failed = {s: v for s, v in m.sections.items() if v.startswith("failed")}
    return ResultRecord.for_config(cfg, env, kind="hw", status="failed" if failed else "ok",
                                   error="\n".join(f"{s}: {v}" for s, v in failed.items()) or None, metrics=m)


def _host(cfg: HwConfig, device: torch.device, m: HwMetrics, log: Log) -> str:
    iters = cfg.iters or (20 if cfg.quick else 100)
    m.host_dispatch = host.dispatch(device, iters, warmup=10)
    m.host_dispatch_us = m.host_dispatch["us"]
    log(f"hw: host dispatch {m.host_dispatch_us:,.0f} us per forward + backward of {host.LAYERS} small layers")
    return "ok"


def _matmul(cfg: HwConfig, device: torch.device, m: HwMetrics, log: Log) -> str:
    iters = cfg.iters or (20 if cfg.quick else 100)
    warmup = 10 if cfg.quick else 50  # mamf-finder's default
    for dtype in cfg.dtypes or matmul.default_dtypes(device):
        m.matmul.append(matmul.sweep(dtype, device, cfg.quick, iters, warmup, log))
    # On GPUs the bf16 rate is the bar for training's MFU; on CPU the best dtype is what the machine can do.
    bf16 = [r for r in m.matmul if r["dtype"] == "bf16"]
    head = bf16[0] if bf16 and device.type == "cuda" else max(m.matmul, key=lambda r: r["best_mean_tflops"])
    m.mamf_tflops, m.mamf_dtype, m.mamf_shape = head["best_mean_tflops"], head["dtype"], head["best_shape"]
    peak = peak_flops(m.device_name) if device.type == "cuda" and head["dtype"] == "bf16" else None
    m.mamf_fraction_of_peak = m.mamf_tflops * 1e12 / peak if peak else None
    return "ok"


def _bandwidth(cfg: HwConfig, device: torch.device, m: HwMetrics, log: Log) -> str:
    iters = cfg.iters or (20 if cfg.quick else 100)
    size = (256 if cfg.quick else 1024) * 2**20 if device.type == "cuda" else (64 if cfg.quick else 256) * 2**20
    copy = bandwidth.device_copy(device, size, iters, warmup=5)
    m.copy_gbps = copy["gbps"]
    m.device_copy = copy
    log(f"hw: device copy {copy['gbps']:,.1f} GB/s (read + write)")
    if device.type == "cuda":
        m.transfers = bandwidth.host_transfers(device, size // 4, max(5, iters // 4), warmup=2)
        log("hw: " + ", ".join(f"{t['direction']} {t['memory']} {t['gbps']:,.1f} GB/s" for t in m.transfers))
    return "ok"


def _collectives(cfg: HwConfig, device: torch.device, m: HwMetrics, log: Log) -> str:
    n = cfg.nproc or (torch.cuda.device_count() if device.type == "cuda" else 2)
    if device.type == "cuda" and n > torch.cuda.device_count():
        raise invalid("nproc", n, f"only {torch.cuda.device_count()} GPUs are visible")
    if n < 2:
        return f"skipped: needs 2 or more GPUs ({n} visible)"
    cap = 32 * 2**20 if cfg.quick and device.type == "cpu" else 2**30
    top = cfg.max_size or max(cfg.min_size, cap)
    sizes = collectives.sizes(cfg.min_size, top, 32 if cfg.quick else 2)
    iters = cfg.iters or (5 if cfg.quick else 20)  # nccl-tests: -n 20 -w 5
    log(f"hw: collectives on {n} {'GPUs' if device.type == 'cuda' else 'processes'}, {len(sizes)} sizes "
        f"{sizes[0]:,} to {sizes[-1]:,} bytes")
    out = collectives.run(device.type, n, sizes, iters, 2 if cfg.quick else 5, cfg.timeout, cfg.telemetry)
    m.collectives, m.collective_world_size, m.collective_backend = out["rows"], out["world_size"], out["backend"]
    m.collectives_telemetry = RunTelemetry.model_validate(out["telemetry"]) if out["telemetry"] else None
    m.busbw_peak_gbps = {op: max(r["busbw_gbps"] for r in out["rows"] if r["op"] == op) for op in collectives.OPS}
    log("hw: peak busbw " + ", ".join(f"{op} {v:,.1f} GB/s" for op, v in m.busbw_peak_gbps.items()))
    return "ok"
