"""LoRA on a mixture of experts' expert weights applied to the routed tokens (methods.expert_adapters) against
peft's own path over the same model (the expert weights rebuilt with their adapters at every pass): values and
every gradient in fp32, for each family's experts class (Qwen3-MoE's and Mixtral's (experts, out, in) weights,
gpt-oss's transposed weights with biases and its own gate); disabled, merged and saved adapters stay peft's."""

import copy
import warnings

import pytest
import torch

from tunebench.methods.expert_adapters import NAME, use_grouped_expert_adapters
from tunebench.models.experts import use_autocast_experts

TINY = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
FAMILIES = {
    "qwen3moe": ("Qwen3MoeConfig", dict(intermediate_size=128, moe_intermediate_size=48, num_experts=8,
                                        num_experts_per_tok=2, head_dim=16)),
    "mixtral": ("MixtralConfig", dict(intermediate_size=96, num_local_experts=4, num_experts_per_tok=2)),
    "gpt-oss": ("GptOssConfig", dict(intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
                                     layer_types=["sliding_attention", "full_attention"])),
}
EXPERT_WEIGHTS = ["experts.gate_up_proj", "experts.down_proj"]
ROUTERS = {"qwen3moe": "mlp.gate.weight", "mixtral": "mlp.gate.weight", "gpt-oss": "mlp.router.weight"}


def _pair(family: str, rank: int = 3):
    """peft's model (its own path) and a copy routed through the grouped adapters, the router adapted too (as under
    all-linear); B drawn non-zero."""
    import transformers
    from peft import LoraConfig, get_peft_model

    cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**TINY | extra))
    use_autocast_experts(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj"],
                                               target_parameters=EXPERT_WEIGHTS + [ROUTERS[family]]))
    for name, p in ref.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    ours = copy.deepcopy(ref)
    assert use_grouped_expert_adapters(ours) == 2  # one experts module a block
    assert ours.get_base_model().config._experts_implementation == NAME
    return ref, ours


def _loss_and_grads(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_values_and_gradients_equal_peft(family):
    """A rank of 3 (padded to 8 inside) on both expert weights: the loss and every adapter's gradient as peft's."""
    ref, ours = _pair(family)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    loss_ref, grads_ref = _loss_and_grads(ref, ids)
    loss, grads = _loss_and_grads(ours, ids)
    assert loss == pytest.approx(loss_ref, abs=1e-6)
    assert grads.keys() == grads_ref.keys() and sum("experts" in n for n in grads) == 8
    assert sum(".gate." in n or ".router." in n for n in grads) == 4
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], rtol=1e-5, atol=1e-6)


def test_disabled_merged_and_saved_adapters_stay_peft(tmp_path):
    """peft's disabled adapters give the base model's outputs; merged ones the adapted outputs (no second add); the
    saved adapter is peft's, and loaded into a model on peft's own path it computes the same."""
    from peft import PeftModel

    ref, ours = _pair("qwen3moe")
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        adapted = ours(input_ids=ids).logits
        with ours.disable_adapter():
            base = ours(input_ids=ids).logits
        with ref.disable_adapter():
            torch.testing.assert_close(base, ref(input_ids=ids).logits, rtol=0, atol=0)
        assert (adapted - base).abs().max() > 1e-3
        ours.save_pretrained(tmp_path)
        merged = copy.deepcopy(ours).merge_and_unload()
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted, rtol=1e-5, atol=1e-5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = PeftModel.from_pretrained(_base("qwen3moe"), tmp_path)  # peft's own path
        torch.testing.assert_close(loaded(input_ids=ids).logits, adapted, rtol=1e-5, atol=1e-5)


def _base(family: str):
    import transformers

    cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**TINY | extra))
    use_autocast_experts(model)
    return model


def test_no_expert_sized_tensor_is_kept_and_frozen_experts_take_no_gradient():
    """Autograd keeps nothing the size of an expert weight beside the weights themselves (peft's path keeps the
    rebuilt stack), and the frozen experts get no gradient."""
    ref, ours = _pair("mixtral", rank=8)
    experts = ours.get_base_model().model.layers[0].mlp.experts
    while hasattr(experts, "base_layer"):
        experts = experts.base_layer
    big = min(experts.gate_up_proj[0].numel(), experts.down_proj[0].numel()) * experts.num_experts
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))

    def largest(model) -> int:
        """The largest tensor autograd keeps, parameters left out."""
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        sizes = [0]

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids).loss.backward()
        return max(sizes)

    assert largest(ref) >= big > largest(ours)
    assert experts.gate_up_proj.grad is None and experts.down_proj.grad is None


def test_bf16_autocast_keeps_fp32_adapter_gradients():
    """Under bf16 autocast over a bf16 base (LoRA's training): the adapters' gradients are fp32 and close to peft's."""
    ref, ours = _pair("qwen3moe", rank=8)
    for model in (ref, ours):
        model.get_base_model().to(torch.bfloat16)
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.data = p.data.float()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_ref, grads_ref = _loss_and_grads(ref, ids)
        loss, grads = _loss_and_grads(ours, ids)
    assert loss == pytest.approx(loss_ref, rel=2e-2)
    for name, g in grads.items():
        assert g.dtype == torch.float32
        if "experts" in name:
            cos = torch.nn.functional.cosine_similarity(g.flatten(), grads_ref[name].flatten(), dim=0)
            assert cos > 0.99, name


def test_compiled_blocks_share_one_graph_and_compute_as_eager():
    """Two sparse blocks compiled (as tunebench compiles each block): no graph break (peft's parametrization of the
    router broke the graph at every call, and made torch.compile trace the block again at every step), one graph
    for both blocks and every call (a forward set per module would be guarded by identity: a new trace each, up to
    dynamo's limit), the same output and adapter gradients as eager. Inductor's code (it once folded B's
    reordering into a view the grouped GEMM refused) is checked on a GPU: family_checks.py's compiled Qwen3-MoE
    LoRA, its experts adapted (benchmarks/results/families.md)."""
    from torch._dynamo.utils import counters

    _, ours = _pair("qwen3moe", rank=8)
    blocks = [layer.mlp.to(torch.bfloat16) for layer in ours.get_base_model().model.layers]  # bf16's grouped GEMMs
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(5), dtype=torch.bfloat16)

    def run(fn, block):
        out = fn(x)
        return out, torch.autograd.grad(out.square().sum(), [p for n, p in block.named_parameters() if "lora_" in n])

    torch._dynamo.reset()
    assert torch._dynamo.explain(blocks[0])(x).graph_break_count == 0
    torch._dynamo.reset()
    counters.clear()
    for block in blocks:  # autograd's graphs traced, without inductor's code generation (the suite's time)
        compiled = torch.compile(block, backend="aot_eager")
        expected, got = run(block, block), run(compiled, block)
        run(compiled, block)
        torch.testing.assert_close(got[0], expected[0], rtol=2e-2, atol=2e-2)
        for g, e in zip(got[1], expected[1]):
            torch.testing.assert_close(g, e, rtol=5e-2, atol=5e-2)
    assert counters["stats"]["unique_graphs"] == 1


def _decoded_4bit(param) -> torch.Tensor:
    """A bitsandbytes 4-bit parameter's weights decoded from its format alone: each byte's two codes (high nibble
    first) looked up and scaled by their block's absmax, itself decoded from its 8-bit codes where double-quantized.
    (bitsandbytes' own CPU dequantization is wrong on some CPUs for rows narrower than a block: 1.5 off on a
    (64, 48) weight, where every row starts inside a block.)"""
    import torch.nn.functional as F

    state = param.quant_state
    absmax = state.absmax
    if state.nested:
        inner = state.state2
        n, size = absmax.numel(), inner.blocksize
        codes = F.pad(inner.code[absmax.long()], (0, -n % size)).view(-1, size)
        absmax = (codes * inner.absmax[:, None]).reshape(-1)[:n] + state.offset
    packed = param.data.reshape(-1)
    nibbles = torch.stack([(packed >> 4).long(), (packed & 15).long()], 1).reshape(-1)
    return (state.code[nibbles].view(-1, state.blocksize) * absmax[:, None].float()).reshape(state.shape)


@pytest.mark.parametrize("family", ["qwen3moe", "mixtral"])
def test_4bit_experts_adapters_equal_peft_over_their_dequantized_weights(family):
    """QLoRA's 4-bit experts (models.experts4bit) with adapters on both weights and the router: the loss and every
    adapter's gradient as peft's own path over transformers' experts holding the dequantized weights, in fp32; peft
    made the same adapters from the packed weights as from the 16-bit ones; disabled, the base experts alone."""
    import transformers
    from peft import LoraConfig, get_peft_model

    from tunebench.methods.expert_adapters import shaped_for_peft
    from tunebench.models.experts4bit import WEIGHTS, Experts4bit, quantize_experts

    cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**TINY | extra))
    quantized = copy.deepcopy(model)
    assert quantize_experts(quantized, torch.float32, "nf4", True) == 2
    for ref, ours in zip(model.model.layers, quantized.model.layers, strict=True):
        with torch.no_grad():
            for w in WEIGHTS:
                getattr(ref.mlp.experts, w).copy_(_decoded_4bit(getattr(ours.mlp.experts, w)))
    lcfg = LoraConfig(r=3, lora_alpha=6, target_modules=["q_proj"], init_lora_weights=False,
                      target_parameters=EXPERT_WEIGHTS + [ROUTERS[family]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(1)
        ref = get_peft_model(model, copy.deepcopy(lcfg))
        torch.manual_seed(1)
        with shaped_for_peft(quantized):
            ours = get_peft_model(quantized, copy.deepcopy(lcfg))
    assert not any(hasattr(p, "ds_shape") for p in ours.parameters())
    shapes = {n: p.shape for n, p in ref.named_parameters() if p.requires_grad}
    assert shapes == {n: p.shape for n, p in ours.named_parameters() if p.requires_grad}
    ours.load_state_dict({n: p for n, p in ref.state_dict().items() if "lora_" in n}, strict=False)  # the same values
    assert use_grouped_expert_adapters(ours) == 2 and use_grouped_expert_adapters(ours) == 2  # again: no change
    assert sum(isinstance(m, Experts4bit) and type(m) is not Experts4bit for m in ours.modules()) == 2
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    loss_ref, grads_ref = _loss_and_grads(ref, ids)
    loss, grads = _loss_and_grads(ours, ids)
    assert loss == pytest.approx(loss_ref, abs=1e-5)
    assert grads.keys() == grads_ref.keys() and sum("experts" in n for n in grads) == 8
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], rtol=1e-5, atol=1e-6)
    with torch.no_grad(), ref.disable_adapter(), ours.disable_adapter():
        base_ref, base = ref(input_ids=ids, labels=ids).loss, ours(input_ids=ids, labels=ids).loss
    assert base.item() == pytest.approx(base_ref.item(), abs=1e-5) and abs(base.item() - loss) > 1e-4
