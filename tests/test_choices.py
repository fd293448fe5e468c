"""Each choice made once: every `auto` setting resolved by tunebench.choices, read alike by the run and the planner;
every registered strategy complete (its planner facts, its name among the config's choices); the planner's
constants in one calibration table; a planner failure never costs a record."""

import dataclasses
import typing

import pytest

from tunebench import RunConfig, choices, run
from tunebench.config.run import Strategy as StrategyName
from tunebench.gpus import match
from tunebench.plan import predict
from tunebench.plan.calibration import CAL, rows
from tunebench.plan.speed import COLLECTIVES
from tunebench.strategies import METHODS, STRATEGIES, PlannerFacts


def test_every_registered_strategy_is_complete():
    assert set(typing.get_args(StrategyName)) == set(STRATEGIES), "the config's strategy choices and the registry"
    for name, st in STRATEGIES.items():
        assert isinstance(st.planner, PlannerFacts), name
        assert st.planner.collectives == "none" or st.planner.collectives in COLLECTIVES, name
        assert 0 <= st.planner.overlap < 1 and 0 < st.planner.reserve < 1 and st.planner.host_per_block_s > 0, name
        assert (st.planner.collectives == "none") == st.one_process, name
        for method in METHODS:  # the planner answers for it, or refuses in words
            cfg = RunConfig(model="llama-3-8b", method=method, strategy=name, grad_ckpt=True, seq_len=1024)
            p = predict(cfg, match("H100"), 1 if st.one_process else 4)
            assert p.tokens_per_s > 0 and p.mem.total > 0, (name, method)


def test_a_new_strategy_is_one_row(monkeypatch):
    """A strategy registered with facts of its own is planned from them alone (no table keyed by name)."""
    ddp = STRATEGIES["ddp"]
    slow = dataclasses.replace(ddp, planner=dataclasses.replace(ddp.planner, host_per_block_s=10 * ddp.planner
                                                               .host_per_block_s, reserve=0.5))
    cfg = RunConfig(model="llama-3-8b", method="full", strategy="ddp", compile=False, seq_len=1024)
    before = predict(cfg, match("H100"), 2)
    monkeypatch.setitem(STRATEGIES, "ddp", slow)
    after = predict(cfg, match("H100"), 2)
    assert after.time.parts["host"] == pytest.approx(10 * before.time.parts["host"])
    assert after.mem.reserve_bytes > before.mem.reserve_bytes


@pytest.mark.parametrize("device,expected", [("cuda", ("bf16", True, "model", True)),
                                             ("cpu", ("fp32", False, "auto", False))])
def test_auto_is_resolved_once_and_read_alike(device, expected):
    cfg = RunConfig(model="tinygpt-124m", method="full", seq_len=1024, batch_size=4)
    made = choices.resolve(cfg, STRATEGIES["single"], device)
    assert (made.precision, made.compile, made.compile_scope, made.cuda_graphs) == expected
    assert choices.resolve(made, STRATEGIES["single"], device) == made  # nothing left to choose
    if device == "cuda":  # the planner plans what the run runs
        planned = predict(cfg, match("H100"), 1).cfg
        assert (planned.precision, planned.compile, planned.compile_scope, planned.cuda_graphs) == expected


def test_the_traced_checkpoint_is_chosen_in_one_place():
    cfg = RunConfig(model="llama-3-8b", method="lora", grad_ckpt=True, compile=True)
    assert choices.traces_whole_checkpoint(choices.resolve(cfg, STRATEGIES["single"], "cuda"), STRATEGIES["single"])
    zero3 = cfg.model_copy(update={"strategy": "zero3"})
    assert not choices.traces_whole_checkpoint(choices.resolve(zero3, STRATEGIES["zero3"], "cuda"), STRATEGIES["zero3"])
    eager = cfg.model_copy(update={"compile": False})
    assert not choices.traces_whole_checkpoint(choices.resolve(eager, STRATEGIES["single"], "cuda"), STRATEGIES["single"])


def test_the_calibration_table_names_unit_and_source_of_every_constant():
    table = rows()
    assert len(table) == len(dataclasses.fields(CAL)) >= 40
    for name, value, unit, fitted_on in table:
        assert value is not None and unit.strip() and fitted_on.strip(), name


def test_a_planner_failure_never_loses_the_record(tmp_path, monkeypatch, capsys):
    """A GPU run whose prediction raises is stored without one, with one warning."""
    import tunebench.api.plan as api_plan
    from tunebench.api.records import finalize
    from tunebench.store import Store

    rec = run(RunConfig(model="tiny-llama", steps=2, warmup=1, seq_len=16, device="cpu"))
    rec.environment["device"], rec.environment["gpu"] = "cuda", {"name": "NVIDIA H100 80GB HBM3"}  # as on a GPU
    rec.metrics.predicted = None
    assert api_plan.prediction_for(rec) is not None  # the planner answers for it...

    def broken(*args, **kwargs):
        raise KeyError("a strategy the planner has no row for")

    monkeypatch.setattr(api_plan, "predict", broken)  # ...until it fails
    capsys.readouterr()
    store = tmp_path / "r.db"
    assert finalize(rec, store).metrics.predicted is None
    assert "the planner failed" in capsys.readouterr().err
    with Store(store, create=False) as s:
        assert s.get(rec.id[:12]).id == rec.id


def test_plan_prints_its_calibration(tb):
    code, out, _ = tb("plan", "--calibration")
    assert code == 0 and "grouped_half_rows" in out and "fitted on" in out and "zero3" in out
