"""Reports: files written, tables and CSV equal to the store, failures shown, compare, cost, and the
HTML rendered in headless Chromium."""

import csv
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest

from conftest import run_json
from tunebench.record import ResultRecord, TrainMetrics, flat_row
from tunebench.report.cost import Offering, cost_of, load_prices
from tunebench.store import Store


def _gpu_record(tps: float, mem: int, model: str = "mistral-7b", world: int = 1, status: str = "ok",
                seq: int = 512) -> ResultRecord:
    cfg = {"model": model, "method": "qlora", "strategy": "single", "batch_size": 8, "grad_accum": 1,
           "seq_len": seq, "precision": "bf16"}
    m = TrainMetrics(world_size=world, tokens_per_s=tps if status == "ok" else None,
                     tokens_per_s_per_gpu=tps / world if status == "ok" else None,
                     samples_per_s=tps / seq if status == "ok" else None, peak_mem_allocated_bytes=mem,
                     peak_mem_reserved_bytes=mem, mfu=0.2 if status == "ok" else None)
    return ResultRecord(config=cfg, config_hash=f"h-{model}-{seq}", status=status,
                        error="CUDA out of memory. Tried to allocate 2.00 GiB" if status == "oom" else None,
                        environment={"device": "cuda", "gpu": {"name": "NVIDIA H100 80GB HBM3", "count": 1,
                                                               "memory_bytes": 80 * 2**30}}, metrics=m)


@pytest.fixture
def mixed_store(tb, tmp_path):
    """Real CPU runs (ok and failed) plus GPU-shaped records, one of them out of memory."""
    store = tmp_path / "r.db"
    run_json(tb, store, "--method", "full")
    run_json(tb, store, "--method", "lora")
    failed = run_json(tb, store, "--method", "lora", "--fault", "raise@2")
    assert failed["status"] == "failed"
    with Store(store) as s:
        s.save(_gpu_record(8000.0, 6 * 2**30))
        s.save(_gpu_record(0.0, 79 * 2**30, seq=4096, status="oom"))
    return store


def test_report_files_and_tables_match_the_store(tb, tmp_path, mixed_store):
    out = tmp_path / "rep"
    code, stdout, err = tb("report", "--store", str(mixed_store), "--out", str(out), "--publish")
    assert code == 0, err
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "report.html", "results.csv", "results.parquet", "throughput.png"} <= names
    assert all((out / n).stat().st_size > 1000 for n in names if n.endswith(".png"))
    with Store(mixed_store) as s:
        records = list(s.records())
    expected = [flat_row(r) for r in records]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(expected) == 5
    for row, exp in zip(rows, expected):
        for k, v in exp.items():
            assert row[k] == ("" if v is None else str(v)), k
    table = pq.read_table(out / "results.parquet").to_pylist()
    assert [r["metrics.tokens_per_s"] for r in table] == [e["metrics.tokens_per_s"] for e in expected]
    md = (out / "report.md").read_text()
    for r in records:  # every run is in the performance table, with its status and exact figure
        tps = "-" if r.metrics.tokens_per_s is None else f"{r.metrics.tokens_per_s:,.1f}"
        assert f"| {r.status} | {tps} |" in md
    assert "| oom |" in md and "| failed |" in md and "CUDA out of memory" in md
    assert "5 runs of 5 configurations: 3 ok, 1 oom, 1 failed." in md
    assert "ended with status oom: it does not fit this GPU" in md
    assert "$" in md and "H100" in md  # the GPU record is priced from the shipped sheet
    assert len(list((out / "publish").glob("*.md"))) == 5


def test_report_in_headless_chromium(tb, tmp_path, mixed_store, chromium):
    out = tmp_path / "rep"
    assert tb("report", "--store", str(mixed_store), "--out", str(out))[0] == 0
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    url = (out / "report.html").as_uri()
    dom = subprocess.run([chromium, *flags, "--virtual-time-budget=5000", "--dump-dom", url], capture_output=True,
                         text=True, timeout=120).stdout
    assert "<h2>Executive summary</h2>" in dom  # the page loaded
    n = int(dom.split('data-images="')[1].split('"')[0])
    decoded = int(dom.split('data-images-decoded="')[1].split('"')[0])
    assert n >= 3 and decoded == n  # every embedded plot decoded
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", "--window-size=1200,2000", url],
                   capture_output=True, timeout=120)
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 2000)
    assert len(img.getcolors(maxcolors=1 << 20) or []) > 50  # not a blank page


@pytest.fixture(scope="session")
def chromium():
    """A headless browser renders the report where one is installed (tests never install system packages)."""
    path = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if not path:
        pytest.skip("no browser here to render the report (install chromium to run this test)")
    return path


def test_compare_flags_a_planted_regression(tb, tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with Store(a) as s:
        s.save(_gpu_record(8000.0, 6 * 2**30))
        s.save(_gpu_record(5000.0, 5 * 2**30, seq=1024))
    with Store(b) as s:
        s.save(_gpu_record(7200.0, 6 * 2**30))  # planted: 10% slower
        s.save(_gpu_record(5100.0, 5 * 2**30, seq=1024))  # +2%: within the threshold
    code, out, _ = tb("compare", str(a), str(b))
    assert code == 1 and "REGRESSION" in out and "tokens/s -10.0% (regression)" in out
    assert out.count("REGRESSION") == 1
    assert tb("compare", str(a), str(a))[0] == 0
    code, out, _ = tb("compare", str(a), str(b), "--threshold", "0.2")
    assert code == 0


def test_compare_exported_files(tb, tmp_path, mixed_store):
    path = tmp_path / "x.jsonl"
    assert tb("results", "export", "--format", "jsonl", "-o", str(path), "--store", str(mixed_store))[0] == 0
    code, out, _ = tb("compare", str(path), str(mixed_store))
    assert code == 0 and "only in A: 0" in out


def test_cost_arithmetic():
    rec = _gpu_record(8000.0, 6 * 2**30, world=4)
    offer = Offering("x", "H100", "X cloud", 2.0, 1.0, "test", "2026")
    c = cost_of(rec, offer, job_samples=10_000)
    assert c.dollars_per_hour == 8.0
    assert c.per_1m_tokens == pytest.approx(8.0 / (8000 * 3600) * 1e6)
    assert c.per_1k_samples == pytest.approx(8.0 / (8000 / 512 * 3600) * 1000)
    assert c.tokens_per_dollar == pytest.approx(8000 * 3600 / 8.0)
    assert c.job_hours == pytest.approx(10_000 / (8000 / 512) / 3600)
    assert c.job_cost == pytest.approx(c.job_hours * 8.0)
    assert cost_of(rec, Offering("y", "H100", "Y", 2.0, None, "t", "d"), spot=True) is None  # no spot price


def test_shipped_price_sheet_has_sources():
    prices = load_prices()
    gpus = {o.gpu for o in prices}
    assert {"H100", "H200", "A100", r"\bA10\b", r"\bL4\b"} <= gpus
    assert all(o.source and o.date and (o.on_demand or o.spot) for o in prices)


def test_cost_command(tb, tmp_path):
    store = tmp_path / "r.db"
    rec = _gpu_record(8000.0, 6 * 2**30)
    with Store(store) as s:
        s.save(rec)
    code, out, _ = tb("cost", rec.id[:8], "--samples", "5000", "--store", str(store))
    assert code == 0 and "spot" in out and "on-demand" in out
    cpu = run_json(tb, store)
    code, _, err = tb("cost", cpu["id"], "--store", str(store))
    assert code == 2 and "no offering" in err


@pytest.mark.parametrize("step_spread,verdict", [(0.01, "worked"), (0.2, "flat")])
def test_the_noise_is_the_measured_spread_of_runs_and_steps(tmp_path, step_spread, verdict):
    """A 10% gain counts where the steps are steady; where one run's steps scatter by 20% (a busy machine), it is
    within the noise. A train job's data and outputs are no levers."""
    from tunebench.record import StepTimes
    from tunebench.report.context import ReportContext

    base, faster = _gpu_record(1000.0, 2**30), _gpu_record(1100.0, 2**30, seq=1024)
    for r in (base, faster):
        r.metrics.step_time_s = StepTimes(p50=1.0, p90=1.1, p99=1.2, mean=1.0, std=step_spread)
    faster.config |= {"data": "a.jsonl", "output_dir": "out"}
    ctx = ReportContext([base, faster], tmp_path)
    ((rs, eff, noise),) = ctx.effects()
    assert eff == pytest.approx(0.1) and noise == pytest.approx(max(0.02, 2 * step_spread))
    assert (eff > noise) == (verdict == "worked")
    assert ctx.lever(rs) == "seq_len 512 -> 1024"
