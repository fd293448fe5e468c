"""Suites expand as documented; sweeps isolate each run, record every failure kind and resume."""

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import cli_subprocess, runs_gone
from tunebench.errors import UserError
from tunebench.store import Store
from tunebench.suites import builtin_names, expand, load_suite, parse_sets

TINY = {"model": "tiny-llama", "device": "cpu", "seq_len": 64, "batch_size": 2, "steps": 4, "warmup": 1}


def test_grid_is_the_product_of_axes():
    entries = expand({"base": TINY, "axes": {"method": ["full", "lora"], "batch_size": [1, 2, 4]}})
    assert len(entries) == 6
    assert {(e.config.method, e.config.batch_size) for e in entries} == {
        (m, b) for m in ("full", "lora") for b in (1, 2, 4)}
    assert entries[0].name == "method=full, batch_size=1"


def test_runs_are_laid_over_base_and_crossed_with_axes():
    entries = expand({"base": TINY, "runs": [{"name": "a", "lr": 1e-3}, {"method": "lora"}],
                      "axes": {"seq_len": [32, 64]}})
    assert [e.name for e in entries] == ["a, seq_len=32", "a, seq_len=64", "seq_len=32", "seq_len=64"]
    assert entries[0].config.lr == 1e-3 and entries[2].config.method == "lora"


def test_set_overrides_everything_and_duplicates_collapse():
    sets = parse_sets(["batch_size=8", "grad-ckpt=true", "lr=2e-5"])
    assert sets == {"batch_size": 8, "grad_ckpt": True, "lr": "2e-5"}
    entries = expand({"base": TINY, "axes": {"batch_size": [1, 2]}}, sets)
    assert len(entries) == 1 and entries[0].config.batch_size == 8 and entries[0].config.lr == 2e-5


@pytest.mark.parametrize("name,count", [("quick", 2), ("full", 12), ("diagnostic", 6), ("scaling", 12),
                                        ("seed-qlora", 2)])
def test_builtin_suites(name, count):
    assert name in builtin_names()
    entries = expand(load_suite(name))
    assert len(entries) == count
    if name == "diagnostic":
        base = entries[0].config
        assert (base.seq_len, base.batch_size, base.optimizer, base.lora_rank) == (1024, 4, "paged_adamw_8bit", 16)
        assert [e.config.precision for e in entries][-1] == "fp16"


@pytest.mark.parametrize("suite,needle", [
    ({"base": TINY}, "needs 'axes' or 'runs'"),
    ({"base": TINY, "axes": {"batch_size": []}}, "non-empty list"),
    ({"base": TINY, "runs": [{"batch_size": 0}]}, "batch_size"),
    ({"base": TINY, "runs": [{"nope": 1}]}, "unknown key 'nope'"),
    ({"base": TINY, "runs": [{}], "extras": 1}, "unknown key 'extras'"),
])
def test_bad_suites(tmp_path, suite, needle):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(UserError, match=needle):
        expand(load_suite(str(path)))


def test_dry_run_counts(tb, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "base": TINY, "axes": {"lora_rank": [4, 8, 16]}}))
    code, out, _ = tb("sweep", str(path), "--dry-run", "--set", "method=lora", "--store", str(tmp_path / "r.db"))
    assert code == 0 and "3 configurations" in out and "lora_rank=16" in out
    assert not (tmp_path / "r.db").exists()


def _suite(tmp_path, runs, name="t"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "base": TINY, "runs": runs}))
    return path


def test_sweep_records_every_failure_kind_and_goes_on(tmp_path):
    path = _suite(tmp_path, [  # the one ok configuration last: the sweep went on after every failure
        {"name": "crash", "method": "full", "fault": "abort@2"},
        {"name": "hang", "method": "lora", "fault": "hang@1", "run_timeout": 8},  # its own limit: the others none
        {"name": "nan", "method": "full", "lr": 1e30, "precision": "fp32", "steps": 8},
        {"name": "ok lora", "method": "lora"},
    ])
    store = tmp_path / "r.db"
    p = cli_subprocess("sweep", str(path), "--store", str(store), "--json", timeout=600)
    assert p.returncode == 1, p.stderr[-2000:]  # not every configuration is ok
    records = json.loads(p.stdout)
    by_name = {r["config"]["fault"] or ("nan" if r["config"]["lr"] > 1 else r["config"]["method"]): r
               for r in records}
    assert len(records) == 4  # one record per attempt, whoever wrote it
    assert by_name["lora"]["status"] == "ok"
    assert by_name["abort@2"]["status"] == "failed" and "SIGABRT" in by_name["abort@2"]["error"]
    assert "step 2/4" in by_name["abort@2"]["error"]  # the tail of its output
    assert by_name["hang@1"]["status"] == "timeout" and "8 s" in by_name["hang@1"]["error"]
    assert by_name["nan"]["status"] == "nan"
    assert len({r["sweep_id"] for r in records}) == 1
    with Store(store) as s:
        assert s.count() == 4 and s.integrity_check() == "ok"


def test_killed_sweep_resumes_to_exactly_one_ok_per_configuration(tmp_path):
    path = _suite(tmp_path, [{"name": f"r{r}", "method": "lora", "lora_rank": r, "tag": ["t-resume"]}
                             for r in (2, 4, 8)], "k")
    store = tmp_path / "r.db"
    sweep = subprocess.Popen([sys.executable, "-m", "tunebench.cli", "sweep", str(path), "--store", str(store)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if store.exists() and Store(store).count() >= 1:
            break
        time.sleep(0.3)
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()
    assert runs_gone("t-resume"), "a run outlived its killed sweep"
    with Store(store) as s:
        done = list(s.records())
        sweep_id = done[0].sweep_id
        assert 1 <= len(done) < 3 and all(r.status == "ok" for r in done)
    p = cli_subprocess("sweep", "--resume", sweep_id, "--store", str(store), "--json", timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    with Store(store) as s:
        recs = [r for r in s.records() if r.sweep_id == sweep_id]
        assert sorted(r.config["lora_rank"] for r in recs if r.status == "ok") == [2, 4, 8]
        assert len(recs) == 3
    again = cli_subprocess("sweep", "--resume", sweep_id, "--store", str(store), timeout=120)
    assert again.returncode == 0 and "0 runs to do" in again.stderr
    with Store(store) as s:
        assert s.count() == 3


def test_repeats_give_mean_std_and_cv(tmp_path):
    path = _suite(tmp_path, [{"name": "one", "method": "full"}], "rep")
    p = cli_subprocess("sweep", str(path), "--repeats", "2", "--store", str(tmp_path / "r.db"), timeout=300,
                       env={"COLUMNS": "200"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "2/2 ok" in p.stdout and "%" in p.stdout
    with Store(tmp_path / "r.db") as s:
        assert [r.status for r in s.records()] == ["ok", "ok"]


def test_resume_unknown_sweep(tb, tmp_path):
    code, _, err = tb("sweep", "--resume", "nope", "--store", str(tmp_path / "r.db"))
    assert code == 2 and "no sweep with id 'nope'" in err
