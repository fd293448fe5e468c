"""The Python API is the CLI's equal: distributed runs, sweeps and the one save site (a two-process run from Python,
its record aggregating both ranks and saved once: the README's example, run and checked by test_readme; a scaling
series from Python: docs/architecture.md's, run by test_readme; its figures: test_distributed's
test_scaling_records_efficiency)."""

import json

import pytest

from tunebench import RunConfig, run
from tunebench.api import finalize, plan_sweep, register, run_sweep, sweep_records
from tunebench.api import pending as pending_attempts

TINY = dict(model="tiny-llama", device="cpu", seq_len=32, batch_size=1, steps=3, warmup=1)


def test_run_without_store_saves_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rec = run(RunConfig(**TINY))
    assert rec.status == "ok" and not list(tmp_path.iterdir())


def test_sweep_from_python(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text(json.dumps({"name": "py", "base": TINY, "axes": {"method": ["full", "lora"]}}))
    store = tmp_path / "r.db"
    plan = plan_sweep(str(suite))
    register(store, plan)
    run_sweep(plan, store, pending_attempts(store, plan), timeout=300)
    records, complete = sweep_records(store, plan)
    assert complete and sorted(r.config["method"] for r in records) == ["full", "lora"]
    assert {r.sweep_id for r in records} == {plan.id}


def test_unsaveable_result_is_kept_beside_the_store(tmp_path, capsys):
    from tunebench.record import ResultRecord

    bad = tmp_path / "not-a-db"
    bad.write_text("this is not sqlite")
    rec = ResultRecord(config={"model": "m"}, config_hash="h", environment={"device": "cpu"}, status="ok")
    finalize(rec, bad)
    kept = tmp_path / f"tunebench-unsaved-{rec.id}.json"
    assert ResultRecord.model_validate_json(kept.read_text()).id == rec.id
    assert rec.id in capsys.readouterr().err


def test_bad_store_is_refused_before_any_work(tmp_path):
    from tunebench.errors import UserError

    bad = tmp_path / "x.db"
    bad.write_text("garbage that is not a database, long enough to have a header" * 10)
    with pytest.raises(UserError, match="not a tunebench results database"):
        run(RunConfig(**TINY), store=bad)
