"""Model zoo: presets build with the right shapes; local directories load (weights or random init)."""

import json

import pytest
import torch

from conftest import run_json
from tunebench import RunConfig
from tunebench.models import PRESETS, build_model, load_meta_model, resolve_model


@pytest.mark.parametrize("name,params", [
    ("tinygpt-124m", 124_439_808 + 2048 * 768 - 1024 * 768),  # GPT-2 small with 2048 positions, tied head
    ("gpt2-medium", 354_823_168),
    ("llama-3.2-1b", 1_235_814_400),
    ("mistral-7b", 7_248_023_552),
    ("llama-3-8b", 8_030_261_248),
    ("llama-3-70b", 70_553_706_496),
    ("llama-3.1-70b", 70_553_706_496),
])
def test_preset_shapes_match_the_public_models(name, params):
    model = load_meta_model(resolve_model(name), RunConfig(model=name))  # meta: no memory
    assert sum(p.numel() for p in model.parameters()) == params


def test_every_preset_resolves():
    for name in PRESETS:
        assert resolve_model(name).max_positions


def test_qlora_build_quantizes_every_block_linear():
    cfg = RunConfig(model="tiny-llama", method="qlora", device="cpu")
    model, weights = build_model(resolve_model("tiny-llama"), cfg, torch.device("cpu"))
    kinds = {type(m).__name__ for m in model.model.layers.modules()}
    assert "Linear4bit" in kinds and "Linear" not in kinds and weights == "random"
    assert not any(p.device.type == "meta" for p in model.parameters())
    assert type(model.lm_head).__name__ == "Linear"  # the head stays in bf16, as bitsandbytes does


@pytest.fixture
def local_model(tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(resolve_model("tiny-llama").hf_config)
    model.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("method", ["full", "qlora"])
def test_local_directory_with_safetensors(tb, store, local_model, method):
    rec = run_json(tb, store, "--model", str(local_model), "--method", method)
    assert rec["status"] == "ok" and rec["metrics"]["weights"] == "safetensors"


def _dropouts(model) -> set[float]:
    """Every dropout probability a built model will apply: its Dropout modules' and attention's own attribute."""
    ps = {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)}
    return ps | {m.attention_dropout for m in model.modules() if isinstance(getattr(m, "attention_dropout", None), float)}


def test_dropout_sets_every_dropout_of_the_model():
    spec = resolve_model("tinygpt-124m")
    assert _dropouts(load_meta_model(spec, RunConfig(model="tinygpt-124m"))) == {0.1}  # GPT-2's own
    assert _dropouts(load_meta_model(spec, RunConfig(model="tinygpt-124m", dropout=0))) == {0.0}
    assert spec.hf_config.resid_pdrop == 0.1  # the spec's config is copied, not changed
    tiny = resolve_model("tiny-llama")
    assert _dropouts(load_meta_model(tiny, RunConfig(dropout=0.25))) == {0.25}


def test_dropout_reaches_a_local_checkpoint(local_model):
    cfg = RunConfig(model=str(local_model), dropout=0.3, device="cpu")
    model, weights = build_model(resolve_model(str(local_model)), cfg, torch.device("cpu"))
    assert weights == "safetensors" and _dropouts(model) == {0.3}


def test_local_directory_with_config_only_is_random_init(tb, store, tmp_path):
    cfg = resolve_model("tiny-llama").hf_config.to_dict()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rec = run_json(tb, store, "--model", str(tmp_path), "--method", "lora")
    assert rec["status"] == "ok" and rec["metrics"]["weights"] == "random"
