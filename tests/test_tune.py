"""tunebench tune: the search's rules on their own, then real tunes on the CPU (stored, resumed, written out)."""

import json
from pathlib import Path

import pytest
import yaml

from conftest import QUICK
from tunebench.config import RunConfig
from tunebench.gpus import gpu_named
from tunebench.plan import predict
from tunebench.record import ResultRecord, TrainMetrics
from tunebench.store import Store
from tunebench.tune import Objective, Point, Space, Tuner, front
from tunebench.tune.space import structures, with_batch

H100 = gpu_named("H100-80GB")
QWEN_LIKE = RunConfig(model="llama-3.2-1b", seq_len=1024, batch_size=1, optimizer="adamw_fused")


def _planner(cfg: RunConfig):
    return predict(cfg, H100, (cfg.nproc_per_node or 1) * cfg.nnodes)


def _record(cfg: RunConfig, status: str = "ok", tps: float = 1000.0, mem: float = 1e9) -> ResultRecord:
    rec = ResultRecord.for_config(cfg, {"device": "cuda", "gpu": {"name": "NVIDIA H100 80GB HBM3"}}, status=status)
    rec.metrics = TrainMetrics(tokens_per_s=tps if status == "ok" else None,
                               peak_mem_allocated_bytes=int(mem) if status == "ok" else None)
    return rec


def test_space_holds_the_global_batch_and_keeps_one_gpu_single():
    space = Space(worlds=(1, 4), global_batch=16, compile=(False,), checkpointing=((False, 1),))
    shapes = structures(QWEN_LIKE, space)
    assert {(s.strategy, s.nproc_per_node) for s in shapes} == {("single", None), ("ddp", 4), ("fsdp", 4),
                                                                ("zero2", 4), ("zero3", 4)}
    four = next(s for s in shapes if s.strategy == "fsdp")
    assert [(c.batch_size, c.grad_accum) for b in (1, 2, 4, 8) if (c := with_batch(four, b, space))] == \
        [(1, 4), (2, 2), (4, 1)]  # 8 x 4 GPUs overshoots 16


def test_float8_is_tried_for_full_fine_tunes_where_the_gpu_and_torchao_can():
    from tunebench.tune.space import describe, float8_levers

    full, lora = QWEN_LIKE.model_copy(update={"method": "full"}), QWEN_LIKE.model_copy(update={"method": "lora"})
    assert float8_levers(full, fp8_gpu=True, torchao=True) == ("off", "tensorwise")
    assert float8_levers(full, fp8_gpu=False, torchao=True) == float8_levers(full, True, False) == ("off",)
    assert float8_levers(lora, fp8_gpu=True, torchao=True) == ("off",)  # a frozen base in float8: asked for, not tried
    space = Space(worlds=(4,), compile=(True,), checkpointing=((False, 1),), float8=("off", "tensorwise"))
    shapes = structures(full, space)
    tried = {(s.strategy, s.float8) for s in shapes}
    assert tried == {("ddp", "off"), ("ddp", "tensorwise"), ("fsdp", "off"), ("fsdp", "tensorwise"),
                     ("zero2", "off"), ("zero3", "off")}  # DeepSpeed refuses torchao's float8 layers
    assert describe(next(s for s in shapes if s.float8 == "tensorwise")).endswith("float8:tensorwise")
    assert all(p.tokens_per_s > 0 for p in map(_planner, shapes))  # the planner ranks them (float8 fitted)
    assert Space.from_dict(space.as_dict()) == space


def test_search_skips_what_cannot_fit_and_what_ran_out_of_memory():
    space = Space(compile=(False,), checkpointing=((False, 1), (True, 1)), max_batch=512)
    tuner = Tuner(QWEN_LIKE, space, Objective("throughput"), _planner, H100.memory_bytes)
    first = tuner.next()
    assert first is not None and tuner.fits(first)
    assert not any(tuner.fits(c) for c in tuner.candidates if c.cfg.batch_size == 512 and not c.cfg.grad_ckpt)
    # a real OOM at this batch rules out it and every larger batch of the same structure, whatever the planner says
    tuner.observe(first.cfg, _record(first.cfg, "oom"))
    same = [c for c in tuner.candidates if c.structure == first.structure]
    assert all(not tuner.fits(c) for c in same if c.cfg.batch_size >= first.cfg.batch_size)
    nxt = tuner.next()
    assert nxt is not None and not (nxt.structure == first.structure and nxt.cfg.batch_size >= first.cfg.batch_size)


def test_search_prunes_clearly_worse_candidates_and_sets_the_abandon_time():
    space = Space(compile=(False,), checkpointing=((False, 1), (True, 1)), batches=(1, 8))
    tuner = Tuner(QWEN_LIKE, space, Objective("throughput"), _planner, H100.memory_bytes, prune=0.7)
    best = max(tuner.candidates, key=lambda c: c.prediction.tokens_per_s)
    tuner.observe(best.cfg, _record(best.cfg, tps=best.prediction.tokens_per_s))
    slow = min(tuner.candidates, key=lambda c: c.prediction.tokens_per_s)
    assert slow.prediction.tokens_per_s < 0.7 * best.prediction.tokens_per_s
    tuner.next()
    assert slow.skipped == "predicted clearly worse than the best measured"
    tokens = slow.cfg.batch_size * slow.cfg.seq_len
    assert tuner.max_step_s(slow) == (pytest.approx(tokens / (best.prediction.tokens_per_s * 0.8)),
                                      "clearly slower than the best")
    # and no step may be slower than the time left allows for the candidate's steps
    assert tuner.max_step_s(slow, left_s=0.13) == (pytest.approx(0.01), "too slow to finish in the time left")


def test_search_runs_nothing_that_cannot_finish_in_the_time_left_nor_far_beyond_what_ran():
    """On a CPU ranked by a GPU's model: after the baseline (b2, 100 tokens/s), the candidates' times follow
    the measured rate; a batch that would take longer than the time left is not started, and a batch more than 4x
    the largest that ran waits for the batches between."""
    space = Space(compile=(False,), checkpointing=((False, 1),), batches=(2, 4, 8, 16, 64, 1024))
    tuner = Tuner(QWEN_LIKE, space, Objective("throughput"), _planner, None, trial_steps=10)
    assert tuner.expected_s(tuner.candidates[0]) is None  # nothing measured: no rate to go by
    base = next(c for c in tuner.candidates if c.cfg.batch_size == 2)
    tuner.observe(base.cfg, _record(base.cfg, tps=100.0), seconds=10 * 20.48 + 5)  # 20.48 s a step, 5 s setup
    by_batch = {c.cfg.batch_size: c for c in tuner.candidates}
    step8 = 8 * 1024 / (by_batch[8].prediction.tokens_per_s * tuner.ratio())
    assert tuner.expected_s(by_batch[8]) == pytest.approx(10 * step8 + 5, rel=1e-6)
    nxt = tuner.next(left_s=10_000)
    assert nxt.cfg.batch_size == 8  # 16, 64 and 1024 are predicted faster, but more than 4x the b2 that ran
    assert by_batch[64].skipped.startswith("beyond 4x") and by_batch[1024].skipped.startswith("expected to")
    assert tuner.next(left_s=tuner.expected_s(by_batch[8]) - 1).cfg.batch_size == 4
    assert by_batch[8].skipped.startswith("expected to take")
    assert tuner.next(left_s=1.0) is None  # nothing finishes in a second


def test_a_baseline_with_compile_auto_is_not_run_again_as_what_it_resolved_to():
    """The baseline `compile: auto` ran compiled: the grid's compiled twin is that run, not a candidate (a GPU tune
    spent one of its runs on it)."""
    base = QWEN_LIKE.model_copy(update={"compile": "auto", "batch_size": 4})
    tuner = Tuner(base, Space(checkpointing=((False, 1),), batches=(4, 8)), Objective("throughput"), _planner, None)
    rec = _record(base, tps=1000.0)
    rec.metrics.compile_scope = "blocks"
    tuner.observe(base, rec, 30.0)
    twin = next(c for c in tuner.candidates if c.cfg.compile is True and c.cfg.batch_size == 4)
    assert twin.record is rec and len(tuner.measured) == 1
    picked = set()
    while (c := tuner.next()) is not None:
        picked.add((c.cfg.compile, c.cfg.batch_size))
        tuner.observe(c.cfg, _record(c.cfg, tps=900.0), 30.0)
    assert (True, 4) not in picked and (True, 8) in picked
    # the eager ones ran, or were left for a reason the planner gave (predicted clearly slower than the compiled)
    assert all((False, b) in picked or c.skipped for b, c in
               ((c.cfg.batch_size, c) for c in tuner.candidates if c.cfg.compile is False))


def test_the_context_objective_grows_the_sequence_and_an_oom_bounds_its_levers():
    """`--goal context`: the longest sequence that trains at the batch size. Lengths grow at most 4x past the
    longest that ran; one that ran out of memory rules out the longer ones with the same levers, not the others."""
    lengths = tuple(1024 << k for k in range(8))  # 1k .. 128k
    space = Space(seq_lens=lengths, batches=(1,), compile=(False,), checkpointing=((False, 1), (True, 1)))
    tuner = Tuner(QWEN_LIKE, space, Objective("context"), _planner, H100.memory_bytes)
    tuner.observe(QWEN_LIKE, _record(QWEN_LIKE, tps=5000.0))
    first = tuner.next()
    assert first.cfg.seq_len == 4096  # the longest predicted to fit, within 4x of what ran
    tuner.observe(first.cfg, _record(first.cfg, tps=4000.0))
    second = tuner.next()
    assert second.cfg.seq_len == 16384
    tuner.observe(second.cfg, _record(second.cfg, "oom"))
    later = tuner.next()
    same = [c for c in tuner.candidates if c.cfg.grad_ckpt == second.cfg.grad_ckpt and c.cfg.seq_len >= 16384]
    assert all(not tuner.fits(c) for c in same) and later is not None
    assert later.cfg.grad_ckpt != second.cfg.grad_ckpt and later.cfg.seq_len == 16384  # the other levers may
    tuner.observe(later.cfg, _record(later.cfg, tps=3000.0))
    assert tuner.best() is next(c for c in tuner.measured if c is later)
    assert Objective("context").describe(tuner.value(later)) == "16,384 tokens of context"


def test_a_context_search_on_a_gpu_tries_the_mlp_in_chunks_and_the_inputs_offloaded():
    """The long-context levers (engine.chunked_mlp, engine.offload): tried for --goal context only, never with
    blocks keeping their matmuls, never where the strategy refuses them; the planner lets them reach longer."""
    from tunebench.tune.space import MLP_CHUNK, describe, memory_levers

    base = RunConfig(model="llama-3.1-8b", method="qlora", lora_rank=32, batch_size=1, seq_len=16384, grad_ckpt=True)
    assert memory_levers(base, "throughput") == ((None, "none"),)
    levers = memory_levers(base, "context")
    assert levers == ((None, "none"), (MLP_CHUNK, "none"), (MLP_CHUNK, "activations"))
    space = Space(seq_lens=(16384, 65536, 262144), batches=(1,), compile=(True,),
                  checkpointing=((True, 1, "input", 1), (True, 1, "matmuls", 8)), memory=levers)
    shapes = structures(base, space)
    assert not [s for s in shapes if s.mlp_chunk and s.ckpt_keep == "matmuls"]
    assert {(s.mlp_chunk, s.offload) for s in shapes if s.ckpt_keep == "input"} == set(levers)
    assert describe(next(s for s in shapes if s.offload == "activations")).endswith(f"mlp/{MLP_CHUNK} +off")
    fsdp = structures(base, Space(worlds=(2,), strategies=("fsdp",), seq_lens=(16384,), batches=(1,),
                                  compile=(True,), checkpointing=((True, 1),), memory=levers))
    assert {(s.mlp_chunk, s.offload) for s in fsdp} == {(None, "none")}  # whole weights only (single, ddp)
    longest = {m: max(s.seq_len for s in shapes if (s.mlp_chunk, s.offload) == m and s.ckpt_keep == "input"
                      and _planner(s).mem.peak_allocated < H100.memory_bytes) for m in levers}
    assert longest[(None, "none")] < longest[(MLP_CHUNK, "activations")] == 262144
    assert Space.from_dict(space.as_dict()) == space
    # no chunks where the MLP cannot be chunked: a mixture of experts' only, or the whole model one graph
    moe = RunConfig(model="mixtral-8x7b", method="lora", batch_size=1, seq_len=16384, grad_ckpt=True)
    assert memory_levers(moe, "context") == ((None, "none"), (None, "activations"))
    whole = base.model_copy(update={"method": "full", "grad_ckpt": False, "compile_scope": "model"})
    assert all(chunk is None for chunk, _ in memory_levers(whole, "context"))


def test_a_context_tune_on_the_cpu_writes_the_longest_that_trained(tb, tmp_path):
    """`--objective context` is `--goal context` (a training objective is sft, dpo, simpo or orpo)."""
    code, stdout, err = _tune(tb, tmp_path / "t.db", tmp_path / "tune", "--objective", "context", "--max-runs", "2")
    assert code == 0, err
    s = json.loads(stdout)
    lengths = [m["config"]["seq_len"] for m in s["measured"]]
    assert lengths[0] == 64 and all(b <= 4 * max(lengths[:i + 1]) for i, b in enumerate(lengths[1:]))
    assert s["best"]["config"]["seq_len"] == max(lengths) > 64
    best = yaml.safe_load((tmp_path / "tune" / "best.yaml").read_text())
    assert best["seq_len"] == max(lengths) and best.get("objective", "sft") == "sft" and s["objective"] == "context"


def test_a_cpu_tune_leaves_out_what_only_pays_on_a_gpu():
    from tunebench.tune.space import CHECKPOINTING, cpu_space

    space, left_out = cpu_space(Space())
    assert space.compile == (False,) and space.checkpointing == (CHECKPOINTING[0], CHECKPOINTING[-1])
    assert left_out == ["torch.compile", "selective checkpointing"]
    chosen = Space(compile=(True,), checkpointing=((True, 1, "matmuls", 1),))  # the user's own levers stay
    assert cpu_space(chosen) == (chosen, [])


def test_measurements_correct_the_ranking():
    tuner = Tuner(QWEN_LIKE, Space(compile=(False,), batches=(2, 4)), Objective("throughput"), _planner, None)
    c = tuner.candidates[0]
    tuner.observe(c.cfg, _record(c.cfg, tps=c.prediction.tokens_per_s / 2))  # this machine runs at half the model
    other = tuner.candidates[1]
    assert tuner.predicted_value(other) == pytest.approx(other.prediction.tokens_per_s / 2)


def test_objectives_and_pareto_front():
    cost = Objective("cost", price_per_gpu_hour=3.6)
    assert cost.of(1e6, None, 4) == pytest.approx(-4 * 3.6 / 3600)  # $ per 1M tokens, negated
    assert Objective("memory").of(5.0, 2e9, 1) == -2e9
    pts = [Point("fast", 100, 10, 1.0), Point("small", 50, 5, 2.0), Point("worse", 40, 11, 2.5),
           Point("cheap", 60, 12, 0.5)]
    assert [p.key for p in front(pts)] == ["fast", "cheap", "small"]


def test_selective_checkpointing_trains_the_same_and_counts_half_the_recompute(tb, tmp_path):
    losses = {}
    for flags in ((), ("--grad-ckpt",), ("--grad-ckpt", "--ckpt-every", "2")):
        code, out, err = tb("run", *QUICK, "--json", "--no-store", *flags)
        rec = json.loads(out)
        assert code == 0, err
        losses[flags] = rec["metrics"]["losses"]
        if "2" in flags:
            assert "0.5 x (2*N_blocks" in rec["metrics"]["flops_formula"]
    assert len({tuple(v) for v in losses.values()}) == 1


def test_a_run_slower_than_max_step_s_is_abandoned_after_three_steps(tb):
    code, out, _ = tb("run", *QUICK, "--steps", "12", "--json", "--no-store", "--max-step-s", "1e-6")
    rec = json.loads(out)
    assert code == 0 and rec["status"] == "ok"
    assert rec["metrics"]["stopped_early"] is True and rec["metrics"]["timed_steps"] == 3


def _tune(tb, store: Path, out: Path, *extra: str):
    return tb("tune", "--model", "tiny-llama", "--seq-len", "64", "--batch-size", "2", "--device", "cpu",
              "--store", str(store), "--out", str(out), "--trial-warmup", "1", "--trial-steps", "3",
              "--fixed", "compile,checkpointing,optimizer", "--json", *extra)


@pytest.mark.parametrize("out", ["users", "file", "/"])
def test_tune_never_writes_over_someone_elses_files(tb, tmp_path, out):
    """The output folder is claimed before any run: a folder of the user's files, a file, or the root is refused."""
    store = tmp_path / "t.db"
    users = tmp_path / "users"
    users.mkdir()
    (users / "best.yaml").write_text("mine\n")
    (tmp_path / "file").write_text("mine\n")
    target = Path(out) if out == "/" else tmp_path / out
    code, _, err = _tune(tb, store, target, "--max-runs", "1")
    assert code == 2 and err.startswith("tunebench: error: invalid out=") and len(err.strip().splitlines()) == 1
    assert (users / "best.yaml").read_text() == "mine\n" and (tmp_path / "file").read_text() == "mine\n"
    with Store(store) as st:
        assert not list(st.records())  # nothing ran


def test_tune_measures_stores_and_writes_the_best(tb, tmp_path):
    store, out = tmp_path / "t.db", tmp_path / "tune"
    code, stdout, err = _tune(tb, store, out, "--max-runs", "3")
    assert code == 0, err
    s = json.loads(stdout)
    assert s["runs"] == 3 and s["baseline"]["config"]["batch_size"] == 2
    assert s["best"]["tokens_per_s"] >= s["baseline"]["tokens_per_s"]
    assert s["front"] and {"name", "tokens_per_s", "peak_mem_allocated_bytes"} <= set(s["front"][0])
    # on the CPU: memory where it was measured (the host's RSS, no GPU allocation), every trial's steps shown
    assert all(m["peak_mem_allocated_bytes"] is None and m["peak_rss_bytes"] > 0 for m in s["measured"])
    assert "not tried on a CPU" not in err and err.count(" ok in ") == 3  # the levers it holds are the user's
    assert sum(": step " in line for line in err.splitlines()) >= 3 * 3
    with Store(store) as st:
        recs = list(st.records(sweep_id=s["id"]))
        definition = st.sweep(s["id"])
    assert len(recs) == 3 and all("tune" in r.tags for r in recs)
    assert definition["tune"]["objective"] == "throughput" and len(definition["entries"]) == 3
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["model"] == "tiny-llama" and "max_step_s" not in best and "steps" not in best
    assert (out / "pareto.png").stat().st_size > 0
    # what tune wrote is a config run and train take
    code, _, err = tb("run", str(out / "best.yaml"), "--device", "cpu", "--steps", "3", "--warmup", "1",
                      "--no-store")
    assert code == 0, err
    (tmp_path / "corpus.txt").write_text("tune wrote this configuration\n" * 50)
    code, _, err = tb("plan", str(out / "best.yaml"), "--gpu", "H100-80GB", "--no-store")
    assert code == 0, err

    # resumed: the stored runs count, none is repeated, the budget is raised
    code, stdout, err = tb("tune", "--resume", s["id"], "--store", str(store), "--out", str(out), "--max-runs", "4",
                           "--json")
    again = json.loads(stdout)
    assert code == 0, err
    assert again["runs"] == 4 and again["id"] == s["id"]
    names = [m["name"] for m in again["measured"]]
    assert len(set(names)) == 4 and names[:3] == [m["name"] for m in s["measured"]]


@pytest.mark.parametrize("extra, message", [
    (("--max-runs", "0"), "invalid max_runs=0: the budget must allow at least one run"),
    (("--max-minutes", "0"), "invalid max_minutes=0: the budget must be a finite number of minutes above zero"),
    (("--max-minutes", "inf"), "invalid max_minutes=inf: the budget must be a finite number of minutes"),
    (("--goal", "speed"), "invalid goal=speed: choose from throughput, cost, memory"),
    (("--objective", "context", "--goal", "memory"), "invalid objective=context: it names the tune's goal, and"),
    (("--objective", "speed"), "invalid objective=speed: Input should be 'sft', 'dpo', 'simpo' or 'orpo'"),
    (("--goal", "cost"), "goal cost needs a price per GPU-hour for this machine (no GPU)"),
    (("--fixed", "compile,colour"), "invalid fixed=colour: choose from strategy, checkpointing"),
    (("--resume", "tune-nothing"), "no tune with id 'tune-nothing'"),
])
def test_tune_bad_input_is_one_line(tb, tmp_path, extra, message):
    code, _, err = _tune(tb, tmp_path / "t.db", tmp_path / "o", *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_cost_objective_prices_the_gpu_from_the_sheet(tmp_path):
    from tunebench.api.tune import objective_for
    from tunebench.errors import UserError

    obj = objective_for("cost", gpu_named("H100-80GB"), None)
    assert obj.name == "cost" and 1.0 < obj.price_per_gpu_hour < 10.0  # the cheapest on-demand H100 offering
    sheet = tmp_path / "prices.yaml"
    sheet.write_text("offerings:\n  - {name: x, gpu: A100, on_demand: 1.5, spot: null, source: s, date: d}\n")
    assert objective_for("cost", gpu_named("A100-80GB"), str(sheet)).price_per_gpu_hour == 1.5
    with pytest.raises(UserError, match="goal cost needs a price per GPU-hour for L4"):
        objective_for("cost", gpu_named("L4"), str(sheet))
