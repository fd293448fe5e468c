"""LoRA siblings run as one (methods.lora_siblings): peft's values and gradients, one traced graph, peft's files."""

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import run_json
from tunebench.engine.recompute import keep_matmuls
from tunebench.methods.lora_siblings import group_siblings

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: "
                                                                "run on one, see benchmarks/results/qlora-lora.md"))]
CFG = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=96, attention_bias=True, use_cache=False)  # base biases too


def _pair(base_dtype=torch.float32):
    """peft's model and a copy of it, same weights, adapters' B nonzero (else their gradients to A vanish)."""
    torch.manual_seed(0)
    base = LlamaForCausalLM(CFG).to(base_dtype)
    ref = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return ref, copy.deepcopy(ref)


def _layers(model):
    return model.base_model.model.model.layers


def _loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def _assert_same(ref, fused, ids, atol=1e-6):
    l1, g1 = _loss_and_grads(ref, ids)
    l2, g2 = _loss_and_grads(fused, ids)
    assert torch.allclose(l1, l2, atol=atol)
    assert g1.keys() == g2.keys() and len(g1) == 2 * 7 * CFG.num_hidden_layers
    for k in g1:
        assert torch.allclose(g1[k], g2[k], atol=atol), k


def test_siblings_train_as_peft():
    ref, fused = _pair()
    groups = [g for layer in _layers(fused) for g in group_siblings(layer)]
    assert len(groups) == 2 * CFG.num_hidden_layers  # q/k/v and gate/up in each block
    assert [g for layer in _layers(fused) for g in group_siblings(layer)] == []  # grouped once only
    ids = torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    _assert_same(ref, fused, ids)
    assert fused.state_dict().keys() == ref.state_dict().keys()  # peft's names, peft's adapter files
    assert all(g._input is None and g._down is None for g in groups)  # nothing held after the block


def test_one_graph_when_compiled():
    """Traced by torch.compile as one graph per block (no break at the siblings' hand-over), same gradients."""
    from torch._dynamo.testing import CompileCounter

    ref, fused = _pair()
    counter = CompileCounter()
    for layer in _layers(fused):
        assert len(group_siblings(layer)) == 2
        layer.compile(backend=counter, fullgraph=True)
    torch._dynamo.reset()
    _assert_same(ref, fused, torch.randint(0, CFG.vocab_size, (2, 12)))
    # two graphs (the first block's input needs no gradient, the others' do), each reused: none per group
    assert counter.frame_count == 2


@pytest.mark.parametrize("keep", [False, True])
def test_checkpointed_blocks(keep):
    """Recomputed in backward (Hugging Face's checkpoint, or ours keeping the matmuls): the same gradients."""
    ref, fused = _pair()
    for model in (ref, fused):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
        if keep:
            keep_matmuls(_layers(model))
    for layer in _layers(fused):
        group_siblings(layer)
    ref.train(), fused.train()
    _assert_same(ref, fused, torch.randint(0, CFG.vocab_size, (2, 12)))


def test_called_otherwise_each_runs_alone():
    """A sibling called alone, or with another input than the first's, gives peft's own result."""
    ref, fused = _pair()
    group_siblings(_layers(fused)[0])
    a_ref, a = _layers(ref)[0].self_attn, _layers(fused)[0].self_attn
    x, y = torch.randn(2, 5, CFG.hidden_size), torch.randn(2, 5, CFG.hidden_size)
    with torch.no_grad():
        assert torch.allclose(a.k_proj(x), a_ref.k_proj(x), atol=1e-6)  # alone
        assert torch.allclose(a.q_proj(x), a_ref.q_proj(x), atol=1e-6)  # starts a group ...
        assert torch.allclose(a.k_proj(y), a_ref.k_proj(y), atol=1e-6)  # ... another input: alone
        assert torch.allclose(a.v_proj(x), a_ref.v_proj(x), atol=1e-6)
        fused.base_model.disable_adapter_layers()  # no longer plain LoRA: peft's path, base only
        ref.base_model.disable_adapter_layers()
        assert torch.allclose(a.q_proj(x), a_ref.q_proj(x), atol=1e-6)
        assert torch.allclose(a.v_proj(x), a_ref.v_proj(x), atol=1e-6)


def test_dropout_left_to_peft():
    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(CFG), LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.1))
    assert group_siblings(_layers(model)[0]) == []


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_base_under_autocast(device):
    """bf16 base, fp32 adapters, bf16 autocast (as GPUs train; there each block compiled by inductor): within
    bf16 rounding of peft's eager layers."""
    ref, fused = _pair(torch.bfloat16)
    ref, fused = ref.to(device), fused.to(device)
    for layer in _layers(fused):
        group_siblings(layer)
        if device == "cuda":
            layer.compile()
    ids = torch.randint(0, CFG.vocab_size, (2, 12), device=device)
    with torch.autocast(device, torch.bfloat16):
        l1, g1 = _loss_and_grads(ref, ids)
        l2, g2 = _loss_and_grads(fused, ids)
    assert torch.allclose(l1, l2, rtol=1e-2)
    for k in g1:
        assert g1[k].dtype == g2[k].dtype == torch.float32
        assert torch.allclose(g1[k], g2[k], rtol=0.1, atol=0.1 * g1[k].abs().max().item()), k


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_run_losses_equal_apart(tb, tmp_path, method):
    """A whole run (fp32): the siblings as one (the default) train as peft's layers apart do."""
    common = ("--method", method, "--precision", "fp32", "--lr", "5e-3", "--steps", "5")
    fused = run_json(tb, tmp_path / "a.db", *common)
    apart = run_json(tb, tmp_path / "b.db", *common, "--no-lora-fused")
    losses = fused["metrics"]["losses"]
    assert abs(losses[-1] - losses[0]) > 3e-3  # it trains
    assert losses == pytest.approx(apart["metrics"]["losses"], abs=1e-5)
    assert fused["config"]["lora_fused"] is True and apart["config"]["lora_fused"] is False


def test_compiled_block_has_fewer_matmuls():
    """Compiled, a block's graphs hold the siblings as one: forward 18 matmuls against peft's 21 (q/k/v: 3 base,
    1 stacked A, 3 B added in the epilogue; o: 3; gate/up: 2 + 1 + 2; down: 3), backward 29 against 35 (the
    stacked A's two gradients once per group, not once per layer)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}

    def counted(group: bool) -> list[int]:
        torch._dynamo.reset()
        model = _pair()[1]
        graphs = []

        def keep(g, _):
            graphs.append(g)
            return g.forward

        def backend(gm, inputs):  # inductor's partition of the joint graph, no kernels generated
            return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep,
                                         partition_fn=min_cut_rematerialization_partition)

        layer = _layers(model)[1]
        if group:
            group_siblings(layer)
        layer.compile(backend=backend, fullgraph=True)
        _loss_and_grads(model, torch.randint(0, CFG.vocab_size, (2, 12)))
        return [sum(n.target in matmuls for n in g.graph.nodes) for g in graphs]

    assert counted(False) == [21, 35]
    assert counted(True) == [18, 29]


@pytest.mark.parametrize(("compile_scope", "keep", "traced", "grouped"), [
    (None, "matmuls", True, True), ("blocks", "input", False, True), ("blocks", "input", True, False),
    ("blocks", "matmuls", True, False), ("model", "input", True, False)])
def test_runner_groups_where_compile_allows(compile_scope, keep, traced, grouped):
    """The runner groups the siblings, except where compile traces a checkpoint (ours in a compiled block, keeping
    matmuls or recomputing it whole; Hugging Face's inside the whole model's graph): dynamo refuses the hand-over
    there (a side effect inside the checkpoint) and would give the graph up. Eager, every block is grouped."""
    from tunebench.config import RunConfig
    from tunebench.dist import SINGLE
    from tunebench.engine.model import transformer_blocks
    from tunebench.run_preflight import preflight
    from tunebench.runner import Outcome, build_trainable

    for fused in (True, False):
        cfg = RunConfig(model="tiny-llama", method="lora", seq_len=16, batch_size=1, device="cpu", grad_ckpt=True,
                        ckpt_keep=keep, ckpt_traced=traced, lora_fused=fused, compile=compile_scope is not None,
                        compile_scope=compile_scope or "auto")
        plan = preflight(cfg)
        blocks = transformer_blocks(build_trainable(plan, Outcome(), SINGLE).model, plan.spec.num_layers)
        assert ["forward" in vars(b.mlp.up_proj) for b in blocks] == [fused and grouped] * plan.spec.num_layers


def test_zero3_runs_the_siblings_apart():
    """Under ZeRO-3 a module's parameters exist only inside its own forward: the first sibling cannot read the
    others' adapters."""
    from tunebench.strategies import STRATEGIES

    assert [n for n, st in STRATEGIES.items() if not st.lora_siblings] == ["zero3"]


def test_adapters_of_other_ranks_and_scales():
    """peft's rank_pattern / alpha_pattern (q, k, v with their own rank and scale) and rsLoRA's scaling."""
    torch.manual_seed(0)
    base = LlamaForCausalLM(CFG)
    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_rslora=True,
                      rank_pattern={"k_proj": 2, "up_proj": 6}, alpha_pattern={"v_proj": 3})
    ref = get_peft_model(base, lcfg)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    fused = copy.deepcopy(ref)
    assert len([g for layer in _layers(fused) for g in group_siblings(layer)]) == 2 * CFG.num_hidden_layers
    _assert_same(ref, fused, torch.randint(0, CFG.vocab_size, (2, 12)))


def test_deep_copy_computes_with_its_own_weights():
    """A grouped model deep-copied: the copy's siblings use the copy's adapters, the original's its own."""
    ref, fused = _pair()
    for layer in _layers(fused):
        group_siblings(layer)
    twin = copy.deepcopy(fused)
    with torch.no_grad():
        for n, p in twin.named_parameters():
            if "lora_B" in n:
                p.zero_()
    x = torch.randn(2, 5, CFG.hidden_size)
    a, a_twin, a_ref = (_layers(m)[0].self_attn for m in (fused, twin, ref))
    with torch.no_grad():
        assert torch.allclose(a.q_proj(x), a_ref.q_proj(x), atol=1e-6)
        assert torch.allclose(a_twin.q_proj(x), a_twin.q_proj.base_layer(x), atol=1e-6)  # B zero: the base alone


def test_other_dtypes_without_autocast_left_to_peft():
    """fp32 adapters on a bf16 input without autocast: peft computes the adapters in fp32 and casts back; the group
    leaves such a call to it."""
    ref, fused = _pair(torch.bfloat16)  # bf16 base, fp32 adapters
    group_siblings(_layers(fused)[0])
    x = torch.randn(2, 5, CFG.hidden_size, dtype=torch.bfloat16)
    with torch.no_grad():
        attn, attn_ref = _layers(fused)[0].self_attn, _layers(ref)[0].self_attn
        assert torch.equal(attn.q_proj(x), attn_ref.q_proj(x)) and torch.equal(attn.k_proj(x), attn_ref.k_proj(x))
