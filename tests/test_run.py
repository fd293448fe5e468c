"""Each method runs end to end on tiny-llama (CPU) and writes a correct record to the store."""

import csv
import io
import json
import math

import pytest

from conftest import QUICK, run_json
from tunebench import RunConfig, Store, run


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_method_writes_correct_record(tb, store, method):
    rec = run_json(tb, store, "--method", method, "--tag", "t1", "--tag", "two words")
    m, c = rec["metrics"], rec["config"]
    assert rec["status"] == "ok" and rec["error"] is None and rec["schema_version"] == 2
    assert c["method"] == method and rec["tags"] == ["t1", "two words"]
    # 3 timed steps x batch 2 x seq 64 x accum 1, one process
    assert m["timed_steps"] == 3 and m["timed_tokens"] == 3 * 2 * 64 and m["world_size"] == 1
    assert m["tokens_per_s"] == pytest.approx(m["timed_tokens"] / m["wall_s"])
    assert m["samples_per_s"] == pytest.approx(m["tokens_per_s"] / 64)
    st = m["step_time_s"]
    assert 0 < st["p50"] <= st["p90"] <= st["p99"] and st["mean"] > 0
    assert sum(st.values()) < m["wall_s"] * 10
    assert len(m["losses"]) == 4 and all(math.isfinite(x) for x in m["losses"])
    assert m["loss_first"] == m["losses"][0] and m["loss_last"] == m["losses"][-1]
    assert abs(m["loss_first"] - math.log(1024)) < 0.5  # random init on uniform tokens: about ln(vocab)
    assert m["setup_s"] > 0 and m["weights"] == "random" and m["peak_rss_bytes"] > 0
    assert m["mfu"] is None and m["peak_flops"] is None  # CPU: no peak table entry, never a guess
    assert m["peak_mem_allocated_bytes"] is None
    trainable_all = m["params_trainable"] == m["params_total"]
    assert trainable_all == (method == "full")
    env = rec["environment"]
    assert env["device"] == "cpu" and env["versions"]["torch"] and env["versions"]["transformers"]
    assert env["tunebench"]["version"]
    with Store(store) as s:
        assert s.count() == 1
        assert s.get(rec["id"][:8]).model_dump(mode="json") == rec


def test_results_list_show_export(tb, store):
    ids = [run_json(tb, store, "--method", m)["id"] for m in ("full", "lora")]
    code, out, _ = tb("results", "list", "--store", str(store))
    assert code == 0 and all(i[:12] in out for i in ids)
    code, out, _ = tb("results", "show", ids[1][:10], "--store", str(store))
    assert json.loads(out)["id"] == ids[1]
    code, out, _ = tb("results", "export", "--format", "jsonl", "--store", str(store))
    assert [json.loads(line)["id"] for line in out.splitlines()] == ids
    code, out, _ = tb("results", "export", "--format", "csv", "--store", str(store))
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["id"] for r in rows] == ids and rows[1]["config.method"] == "lora"
    assert float(rows[0]["metrics.tokens_per_s"]) > 0


def test_env_var_store(tb, tmp_path, monkeypatch):
    path = tmp_path / "via-env.db"
    monkeypatch.setenv("TUNEBENCH_STORE", str(path))
    code, out, err = tb("run", *QUICK)
    assert code == 0 and "tokens/s" in out
    assert Store(path).count() == 1


def test_yaml_config_and_flags_win(tb, store, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("method: lora\nlora_rank: 4\nseq_len: 32\ntag: from-yaml\n")
    rec = run_json(tb, store, str(cfg), "--lora-rank", "2")  # QUICK sets seq_len 64, flags win
    assert rec["config"]["lora_rank"] == 2 and rec["config"]["seq_len"] == 64 and rec["tags"] == ["from-yaml"]


def test_nan_loss_ends_run_with_status_nan(tb, store):
    rec = run_json(tb, store, "--steps", "8", "--lr", "1e30", "--precision", "fp32")
    assert rec["status"] == "nan" and "at step" in rec["error"]
    assert len(rec["metrics"]["losses"]) < 8  # the run stopped early
    assert Store(store).get(rec["id"]).status == "nan"


def test_grad_accum_ckpt_and_8bit_optimizer(tb, store):
    rec = run_json(tb, store, "--method", "qlora", "--grad-accum", "2", "--grad-ckpt", "--optimizer", "paged_adamw_8bit")
    m = rec["metrics"]
    assert rec["status"] == "ok" and m["timed_tokens"] == 3 * 2 * 2 * 64
    assert m["hfu_flops_per_token"] > m["flops_per_token"]


def test_python_api():
    rec = run(RunConfig(model="tiny-llama", method="lora", steps=3, warmup=1, seq_len=32, device="cpu"))
    assert rec.status == "ok" and rec.metrics.tokens_per_s > 0


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure"])
def test_training_reduces_loss_on_a_repeated_batch(precision):
    """The loop really trains: with a fixed tiny vocabulary pattern the loss falls (bf16-pure too, whose
    weights, gradients and AdamW states are all bf16)."""
    from tunebench.engine import data

    class Repeating(data.SyntheticTokens):
        def next(self):
            if not hasattr(self, "fixed"):
                self.fixed = super().next()
            return self.fixed

    orig = data.SyntheticTokens
    import tunebench.runner as runner

    runner.SyntheticTokens = Repeating
    try:
        rec = run(RunConfig(model="tiny-llama", method="full", steps=12, warmup=1, seq_len=32, lr=3e-3,
                            device="cpu", precision=precision, optimizer="adamw_fused"))
    finally:
        runner.SyntheticTokens = orig
    assert rec.status == "ok" and rec.metrics.precision == precision
    assert rec.metrics.loss_last < rec.metrics.loss_first - 0.5


def test_quick_runs_each_method_and_writes_a_report(tb, store, tmp_path):
    """The README's main command on a machine without a GPU."""
    code, out, err = tb("quick", "--device", "cpu", "--store", str(store), "--out", str(tmp_path / "rep"))
    assert code == 0, err
    assert "tiny-llama full" in out and "tiny-llama qlora" in out
    assert (tmp_path / "rep" / "report.html").stat().st_size > 10_000
    assert [r.status for r in Store(store).records()] == ["ok", "ok", "ok"]
