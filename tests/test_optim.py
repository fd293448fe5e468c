"""The packed bitsandbytes step (engine.optim): exactly the per-tensor update, in a few calls, and resumable, from a
state saved with its buffers cut otherwise too."""

import pytest
import torch

from tunebench.config import RunConfig
from tunebench.engine import optim
from tunebench.engine.optim import build_optimizer, packed

bnb = pytest.importorskip("bitsandbytes")

# LoRA-like shapes (multiples of 256 elements, above the 8-bit minimum), one of another dtype, and two that stay
# apart: too small for 8-bit states, and a size that is no whole number of 256-element blocks
SHAPES = [((16, 512), torch.float32), ((512, 16), torch.float32), ((16, 256), torch.float32),
          ((16, 512), torch.bfloat16), ((16, 512), torch.bfloat16), ((3, 5), torch.float32), ((61, 97), torch.float32)]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: "
                                                                "run on one, see benchmarks/results/qlora-lora.md"))]


def _params(seed: int = 0, device: str = "cpu") -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(device, dt)) for s, dt in SHAPES]


def _steps(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], seeds: range) -> None:
    for seed in seeds:
        g = torch.Generator().manual_seed(100 + seed)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.device, p.dtype)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _uninterrupted_and_stopped(cls: type) -> tuple[list, list, torch.optim.Optimizer]:
    """Six steps of one run, and three of the same run: (the six steps' tensors, the three's, their optimizer)."""
    whole = _params()
    _steps(cls(whole, lr=1e-2), whole, range(6))
    first = _params()
    opt = cls(first, lr=1e-2)
    _steps(opt, first, range(3))
    return whole, first, opt


def _resumed(cls: type, first: list, state: dict) -> tuple[list, torch.optim.Optimizer]:
    """The stopped run's tensors continued from its saved optimizer state for steps 4 to 6."""
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    opt = cls(resumed, lr=1e-2)
    opt.load_state_dict(state)
    _steps(opt, resumed, range(3, 6))
    return resumed, opt


@pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")
@pytest.mark.parametrize("cls", [bnb.optim.AdamW8bit, bnb.optim.PagedAdamW8bit])
@pytest.mark.parametrize("device", DEVICES)
def test_packed_step_equals_the_per_tensor_one(cls, device):
    alone, together = _params(device=device), _params(device=device)
    ref, opt = cls(alone, lr=1e-2, weight_decay=0.01), packed(cls)(together, lr=1e-2, weight_decay=0.01)
    assert sorted(len(ps) for _, ps in opt.packs) == [2, 3]  # fp32 and bf16 packs; the odd two stay apart
    _steps(ref, alone, range(4))
    _steps(opt, together, range(4))
    for a, b, start in zip(alone, together, _params(device=device)):
        assert torch.equal(a, b) and not torch.equal(a, start)  # moved, and identically
        assert b.grad is None
    assert all(flat.numel() == 0 for flat, _ in opt.packs)  # nothing held between steps


@pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")
@pytest.mark.parametrize("cls", [bnb.optim.AdamW8bit, bnb.optim.PagedAdamW8bit])
def test_bounded_buffers_step_as_the_per_tensor_one(cls, monkeypatch):
    """Buffers of at most 8,192 elements (fp32: 16x512 + 512x16 | 16x256, a tensor larger alone its own): the
    per-tensor update, the step's copies a buffer at a time."""
    monkeypatch.setattr(optim, "PACK_ELEMENTS", 16 * 512)
    alone, together = _params(), _params()
    ref, opt = cls(alone, lr=1e-2, weight_decay=0.01), packed(cls)(together, lr=1e-2, weight_decay=0.01)
    assert [len(ps) for _, ps in opt.packs] == [1, 1, 1, 1, 1] and opt.cuts == [[3, 2]]
    _steps(ref, alone, range(4))
    _steps(opt, together, range(4))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


@pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")
def test_a_state_saved_with_whole_buffers_continues_in_bounded_ones(monkeypatch):
    """A checkpoint's optimizer state from one buffer per dtype (as saved before the bound) loads into bounded
    buffers and continues exactly as the run that never stopped."""
    cls = packed(bnb.optim.PagedAdamW8bit)
    whole, first, opt1 = _uninterrupted_and_stopped(cls)
    monkeypatch.setattr(optim, "PACK_ELEMENTS", 16 * 256)
    resumed, opt2 = _resumed(cls, first, opt1.state_dict())
    assert len(opt2.packs) > len(opt1.packs)
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed))


@pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")
def test_packed_state_saved_and_loaded_continues_exactly():
    cls = packed(bnb.optim.PagedAdamW8bit)
    whole, first, opt1 = _uninterrupted_and_stopped(cls)
    resumed, _ = _resumed(cls, first, opt1.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed))


def test_adapters_are_packed_a_full_model_is_not():
    params = _params()
    for method, optimizer, name in (("lora", "paged_adamw_8bit", "PackedPagedAdamW8bit"),
                                    ("qlora", "adamw_8bit", "PackedAdamW8bit"),
                                    ("full", "paged_adamw_8bit", "PagedAdamW8bit"),
                                    ("lora", "adamw_fused", "AdamW")):
        cfg = RunConfig(model="tiny-llama", method=method, optimizer=optimizer, device="cpu")
        assert type(build_optimizer(params, cfg)).__name__ == name


@pytest.mark.filterwarnings("ignore:Paged optimizers are not supported on CPU")
@pytest.mark.parametrize("cls", [bnb.optim.AdamW8bit, bnb.optim.PagedAdamW8bit])
def test_packed_groups_keep_their_weight_decay(cls):
    """Packed within each group: two groups of different weight decay step as the plain optimizer steps them."""
    def groups(params):  # a pack in each: two fp32 tensors in the first, two bf16 ones in the second
        return [{"params": [params[i] for i in (0, 1, 5)]},
                {"params": [params[i] for i in (2, 3, 4, 6)], "weight_decay": 0.0}]

    alone, together = _params(), _params()
    ref, opt = cls(groups(alone), lr=1e-2, weight_decay=0.5), packed(cls)(groups(together), lr=1e-2, weight_decay=0.5)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0] and len(opt.packs) == 2
    _steps(ref, alone, range(3))
    _steps(opt, together, range(3))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


# Weight decay: off for biases, norms and embeddings (engine.optim.param_groups), through the strategy's own build

def _tiny(family: str):
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    config = (LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
              if family == "llama" else
              GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                         eos_token_id=0))
    model = AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    return model


# the embeddings Trainer decays and tunebench does not (GPT-2's head is its token embedding, tied)
EMBEDDINGS = {"llama": {"model.embed_tokens.weight"}, "gpt2": {"transformer.wte.weight", "transformer.wpe.weight"}}


def _single(model, method: str = "full", **kw):
    from tunebench.engine.model import CausalLMWithLoss
    from tunebench.strategies import single

    cfg = RunConfig(**{"model": "tiny-llama", "method": method, "device": "cpu", "precision": "fp32",
                       "optimizer": "adamw", "weight_decay": 0.1} | kw)
    return single.apply(CausalLMWithLoss(model, model.config.vocab_size), None, cfg, torch.device("cpu"), 1).optimizer


def _names_by_decay(model, opt) -> dict[float, set[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {g["weight_decay"]: {names[id(p)] for p in g["params"]} for g in opt.param_groups}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_no_decay_is_transformers_choice_plus_embeddings(family):
    from transformers import Trainer

    model = _tiny(family)
    decayed_by_hf = set(Trainer.get_decay_parameter_names(None, model))  # `self` unused: Trainer's rule alone
    every = {n for n, _ in model.named_parameters()}
    want = (every - decayed_by_hf) | EMBEDDINGS[family]
    groups = _names_by_decay(model, _single(model))
    assert groups == {0.1: every - want, 0.0: want}
    assert any(n.endswith("norm.weight") or ".ln_" in n for n in want) and any(n.endswith("bias") for n in want)
    if family == "gpt2":
        assert model.lm_head.weight is model.transformer.wte.weight  # the head is the embedding: not decayed


def test_lora_adapters_all_decay_as_transformers_decays_them():
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer

    model = get_peft_model(_tiny("llama"), LoraConfig(r=4, target_modules="all-linear"))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained <= set(Trainer.get_decay_parameter_names(None, model))
    assert _names_by_decay(model, _single(model, "lora")) == {0.1: trained}  # no empty second group


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_fused", "adamw_8bit"])
def test_a_step_with_zero_gradients_decays_only_the_decayed(optimizer):
    """AdamW with zero gradients moves a weight by its decay alone: w·(1 - lr·wd) where it decays, not at all
    where it does not (norms, biases, embeddings)."""
    model = _tiny("llama")
    opt = _single(model, optimizer=optimizer, lr=0.01)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    for name in ("model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.bias",
                 "model.embed_tokens.weight"):
        assert torch.equal(after[name], before[name]), name
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight"):
        torch.testing.assert_close(after[name], before[name] * (1 - 0.01 * 0.1), atol=0, rtol=1e-6)
        assert after[name].norm() < before[name].norm()
