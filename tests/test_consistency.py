"""Consistency: spread and outliers against the ±5% throughput / ±2% memory bars."""

import pytest

from conftest import run_json
from tunebench.record import ResultRecord, TrainMetrics
from tunebench.report.consistency import analyse
from tunebench.store import Store


def _rec(tps: float, mem: int, host: str) -> ResultRecord:
    return ResultRecord(config={"model": "m", "method": "qlora"}, config_hash="h", status="ok", tags=["node"],
                        environment={"device": "cuda", "host": {"hostname": host},
                                     "gpu": {"name": "NVIDIA A10", "index": 0}},
                        metrics=TrainMetrics(tokens_per_s=tps, peak_mem_allocated_bytes=mem))


def test_arithmetic():
    c = analyse([_rec(100, 1000, "a"), _rec(102, 1000, "b"), _rec(96, 1010, "c"), _rec(110, 1000, "d")])
    assert c.tps_dev == pytest.approx([(100 - 101) / 101, (102 - 101) / 101, (96 - 101) / 101, (110 - 101) / 101])
    assert c.tps_spread == pytest.approx((110 - 96) / 102)
    assert c.mem_dev[2] == pytest.approx(0.01) and c.mem_spread == pytest.approx(10 / 1002.5)
    assert not c.ok  # node d is 8.9% above the median
    assert analyse([_rec(100, 1000, "a"), _rec(104, 1015, "b")]).ok


def test_stored_runs_from_several_nodes(tb, tmp_path):
    store = tmp_path / "r.db"
    with Store(store) as s:
        for tps, host in ((100.0, "node1"), (101.0, "node2"), (80.0, "node3")):
            s.save(_rec(tps, 2**30, host))
    code, out, err = tb("consistency", "--with-tag", "node", "--store", str(store))
    assert code == 1 and "OUTLIER" in out and "node3" in out and "bar ±5%" in out


def test_real_cpu_runs_and_no_gpu(tb, tmp_path):
    store = tmp_path / "r.db"
    for _ in range(2):
        run_json(tb, store, "--tag", "twice")
    code, out, err = tb("consistency", "--with-tag", "twice", "--store", str(store))
    assert code in (0, 1) and "consistency of 2 runs" in out
    code, _, err = tb("consistency", "--model", "tiny-llama", "--store", str(store))
    assert code == 2 and "no GPU is visible" in err
