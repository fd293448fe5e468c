"""`tunebench hw`: the nccl-tests and MAMF arithmetic against hand-computed values, and the CPU run."""

import json
import math

import pytest
import torch

from tunebench.hw import collectives, matmul
from tunebench.record import ResultRecord, flat_row


def test_busbw_algbw_as_nccl_tests():
    # 1 GiB all-reduce in 10 ms on 4 ranks: algbw = 2^30 / 0.01 / 1e9 = 107.374 GB/s; busbw x 2(n-1)/n = x 1.5
    algbw, busbw = collectives.bandwidths("all_reduce", 2**30, 0.01, 4)
    assert algbw == pytest.approx(107.3741824) and busbw == pytest.approx(161.0612736)
    # all-gather of a 256 MiB output on 8 ranks in 2 ms: algbw 134.2 GB/s, busbw x 7/8
    algbw, busbw = collectives.bandwidths("all_gather", 2**28, 0.002, 8)
    assert algbw == pytest.approx(134.217728) and busbw == pytest.approx(117.440512)
    # reduce-scatter on 2 ranks: busbw is half of algbw
    algbw, busbw = collectives.bandwidths("reduce_scatter", 2**20, 1e-4, 2)
    assert algbw == pytest.approx(10.48576) and busbw == pytest.approx(5.24288)


def test_collective_sizes():
    full = collectives.sizes(32 * 2**10, 2**30)
    assert len(full) == 16 and full[0] == 32768 and full[-1] == 2**30 and all(b == 2 * a for a, b in zip(full, full[1:]))
    assert collectives.sizes(32 * 2**10, 2**30, 32) == [2**15, 2**20, 2**25, 2**30]
    assert collectives.sizes(2**20, 2**20) == [2**20]


def test_mamf_arithmetic(monkeypatch):
    # 2·m·n·k flops: 4096^3 in 1 ms is 137.439 TFLOP/s
    assert matmul.tflops(4096, 4096, 4096, 1e-3) == pytest.approx(137.438953472)
    times = {(64, 64, 64): [0.001, 0.002, 0.004], (128, 64, 32): [0.0005, 0.0005, 0.002]}
    calls = iter([times[(64, 64, 64)], times[(128, 64, 32)]])
    monkeypatch.setattr(matmul, "time_calls", lambda *a, **k: next(calls))
    monkeypatch.setattr(matmul, "shapes", lambda device, quick: [(64, 64, 64), (128, 64, 32)])
    r = matmul.sweep("fp32", torch.device("cpu"), quick=True, iters=3, warmup=0)
    f1, f2 = 2 * 64**3, 2 * 128 * 64 * 32
    a, b = r["shapes"]
    assert a["mean_tflops"] == pytest.approx(f1 / (0.007 / 3) / 1e12)
    assert a["median_tflops"] == pytest.approx(f1 / 0.002 / 1e12) and a["max_tflops"] == pytest.approx(f1 / 0.001 / 1e12)
    assert b["mean_tflops"] == pytest.approx(f2 / 0.001 / 1e12) and b["max_tflops"] == pytest.approx(f2 / 0.0005 / 1e12)
    # MAMF: the best per-shape mean, at its shape; the geometric mean over all shapes
    assert r["best_mean_tflops"] == max(a["mean_tflops"], b["mean_tflops"])
    assert r["best_shape"] == ([64, 64, 64] if a["mean_tflops"] > b["mean_tflops"] else [128, 64, 32])
    assert r["geomean_tflops"] == pytest.approx(math.sqrt(a["mean_tflops"] * b["mean_tflops"]))
    assert r["best_max_tflops"] == pytest.approx(max(f1 / 0.001, f2 / 0.0005) / 1e12)


def test_hw_quick_on_cpu(tb, store):
    code, out, err = tb("hw", "--quick", "--device", "cpu", "--json", "--store", str(store))
    assert code == 0, err
    (rec,) = json.loads(out)
    m = rec["metrics"]
    assert rec["kind"] == "hw" and rec["status"] == "ok" and rec["error"] is None
    assert m["sections"] == {"host": "ok", "matmul": "ok", "bandwidth": "ok", "collectives": "ok"}
    assert m["host_dispatch_us"] == m["host_dispatch"]["us"] >= m["host_dispatch"]["best_us"] > 0
    assert [r["dtype"] for r in m["matmul"]] == ["fp32", "bf16"] and m["mamf_tflops"] > 0
    assert m["mamf_tflops"] == max(r["best_mean_tflops"] for r in m["matmul"])
    assert m["copy_gbps"] > 0 and m["transfers"] == []  # no host<->device on a CPU
    assert m["collective_world_size"] == 2 and m["collective_backend"] == "gloo"
    assert {(r["op"], r["bytes"]) for r in m["collectives"]} == {
        (op, s) for op in collectives.OPS for s in (2**15, 2**20, 2**25)}
    for r in m["collectives"]:
        factor = 1.0 if r["op"] == "all_reduce" else 0.5  # 2(n-1)/n and (n-1)/n at n = 2
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] / 1e6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
    # Telemetry is absent without NVML: null, never zeros, and no telemetry columns in exports
    assert m["telemetry"] is None and m["collectives_telemetry"] is None
    assert not any(k.startswith("metrics.telemetry") for k in flat_row(ResultRecord.model_validate(rec)))
    code, out, _ = tb("results", "list", "--kind", "hw", "--store", str(store))
    assert code == 0 and rec["id"][:12] in out


def test_hw_sections_and_bad_input(tb, store):
    code, out, err = tb("hw", "--quick", "--device", "cpu", "--sections", "matmul", "--dtypes", "fp32",
                        "--json", "--no-store")
    assert code == 0, err
    (rec,) = json.loads(out)
    assert rec["metrics"]["sections"] == {"matmul": "ok"} and rec["metrics"]["collectives"] == []
    for argv, needle in ((["--dtypes", "fp8"], "invalid dtypes=fp8"), (["--sections", "disk"], "invalid sections"),
                         (["--nproc", "1"], "invalid nproc=1"), (["--max-size", "12Q"], "invalid max_size=12Q"),
                         (["--min-size", "1M", "--max-size", "32K"], "max_size")):
        code, _, err = tb("hw", "--device", "cpu", "--no-store", *argv)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
