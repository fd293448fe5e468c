"""`tunebench load` and `tunebench infer` on CPU: records, their arithmetic, and the decoder's correctness."""

import json
import statistics

import pytest
import torch

from tunebench.config import InferConfig
from tunebench.inference import weights_for
from tunebench.inference.generate import generate
from tunebench.models import resolve_model
from tunebench.models.build import Weights, build

INFER = ["--device", "cpu", "--prompt-len", "8", "--new-tokens", "5", "--repeats", "2", "--json"]


def test_load_preset_each_precision(tb, store):
    code, out, err = tb("load", "--device", "cpu", "--precisions", "bf16,int8,nf4", "--json", "--store", str(store))
    assert code == 0, err
    recs = json.loads(out)
    assert [r["config"]["precision"] for r in recs] == ["bf16", "int8", "nf4"]
    assert {r["kind"] for r in recs} == {"load"} and {r["status"] for r in recs} == {"ok"}
    assert len({r["config_hash"] for r in recs}) == 3 and "precisions" not in recs[0]["config"]
    m = {r["config"]["precision"]: r["metrics"] for r in recs}
    assert all(x["load_s"] > 0 and x["disk_bytes"] > 0 and x["weights"] == "random" for x in m.values())
    assert m["bf16"]["read_gbps"] == pytest.approx(m["bf16"]["disk_bytes"] / m["bf16"]["load_s"] / 1e9)
    assert m["nf4"]["model_bytes"] < m["int8"]["model_bytes"] < m["bf16"]["model_bytes"]
    assert m["bf16"]["mem_allocated_bytes"] is None and m["bf16"]["telemetry"] is None  # CPU: no GPU figures
    code, out, _ = tb("results", "list", "--kind", "load", "--store", str(store))
    assert all(r["id"][:12] in out for r in recs)


def test_load_local_directory_cold(tb, tmp_path):
    model, _ = build(resolve_model("tiny-llama"), weights_for("bf16", InferConfig()), torch.device("cpu"))
    model.save_pretrained(tmp_path / "m")
    code, out, err = tb("load", "--model", str(tmp_path / "m"), "--device", "cpu", "--precisions", "fp16",
                        "--cache", "cold", "--json", "--no-store")
    assert code == 0, err
    (rec,) = json.loads(out)
    assert rec["metrics"]["weights"] == "safetensors" and rec["metrics"]["cache"] == "cold"
    code, _, err = tb("load", "--model", str(tmp_path), "--device", "cpu", "--no-store")
    assert code == 2 and "config.json" in err


def test_infer_records_and_arithmetic(tb, store):
    code, out, err = tb("infer", *INFER, "--batch-sizes", "1,3", "--precisions", "bf16,nf4", "--store", str(store))
    assert code == 0, err
    recs = json.loads(out)
    assert [(r["config"]["precision"], r["config"]["batch_size"]) for r in recs] == [
        ("bf16", 1), ("bf16", 3), ("nf4", 1), ("nf4", 3)]
    for r in recs:
        m, b = r["metrics"], r["config"]["batch_size"]
        assert r["kind"] == "infer" and r["status"] == "ok" and m["repeats"] == 2 and len(m["ttft_all_s"]) == 2
        total = statistics.median(t + d for t, d in zip(m["ttft_all_s"], m["decode_all_s"]))
        assert m["tokens_per_s"] == pytest.approx(b * 5 / total)
        assert m["decode_tokens_per_s"] == pytest.approx(b * 4 / m["decode_s"])
        assert m["prefill_tokens_per_s"] == pytest.approx(b * 8 / m["ttft_s"])
        assert m["ms_per_token"] == pytest.approx(m["decode_s"] / 4 * 1e3)
        assert m["telemetry"] is None and m["energy_j_per_token"] is None
    code, out, _ = tb("report", "--out", str(store.parent / "rep"), "--store", str(store))
    md = (store.parent / "rep" / "report.md").read_text()
    assert code == 0 and "## Inference" in md and "(inference.png)" in md


def test_static_cache_and_compile_refusal(tb):
    code, out, err = tb("infer", *INFER, "--batch-sizes", "2", "--precisions", "bf16", "--kv-cache", "static",
                        "--no-store")
    assert code == 0, err
    assert json.loads(out)[0]["config"]["kv_cache"] == "static"
    code, _, err = tb("infer", "--device", "cpu", "--compile", "--no-store")
    assert code == 2 and "kv_cache=static" in err and len(err.strip().splitlines()) == 1
    code, _, err = tb("infer", "--device", "cpu", "--prompt-len", "2000", "--new-tokens", "100", "--no-store")
    assert code == 2 and "maximum of 2048 positions" in err


@pytest.mark.parametrize("static", [False, True])
def test_decoder_matches_hf_generate(static):
    """Our loop is greedy decoding: the same tokens as transformers' generate, with either cache."""
    from transformers import StaticCache

    model, _ = build(resolve_model("tiny-llama"), Weights(dtype=torch.float32, use_cache=True, seed=3),
                     torch.device("cpu"))
    model.eval()
    ids = torch.randint(0, 1024, (2, 7), generator=torch.Generator().manual_seed(0))
    cache = StaticCache(config=model.config, max_cache_len=7 + 6) if static else None
    _, _, ours = generate(model, model, ids, 6, cache)
    ref = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, ref[:, 7:])
    if static:  # the cache is reset in place: a second generation gives the same tokens
        assert torch.equal(generate(model, model, ids, 6, cache)[2], ours)
