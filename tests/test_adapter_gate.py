"""The adapters scaled by zero (methods.adapter_gate) are peft's adapters disabled, bit for bit, on every kind of
adapted layer: peft's linear layers, siblings run as one (methods.lora_siblings), a mixture of experts' grouped
expert adapters and its adapted router; and the scales come back when the gate opens."""

import pytest
import torch

from tunebench.methods.adapter_gate import AdapterGate


def _logits(model, ids):
    return model(input_ids=ids).logits


def _check(model, ids):
    gate = AdapterGate(model)
    policy = _logits(model, ids)
    with model.disable_adapter():
        base = _logits(model, ids)
    assert not torch.equal(policy, base)  # the adapters matter (B drawn non-zero)
    gate.install(torch.device("cpu"))
    with gate.closed():
        assert torch.equal(_logits(model, ids), base)
    assert torch.equal(_logits(model, ids), policy)  # open again: the adapters' scales as peft set them
    scales = {id(s) for m in model.modules() if isinstance(getattr(m, "scaling", None), dict)
              for s in m.scaling.values()}
    assert len(scales) == 1  # one shared tensor for the one scale (alpha / r) every layer has


def test_peft_layers_and_siblings_scaled_by_zero_are_the_base():
    from test_lora_siblings import CFG, _layers, _pair
    from tunebench.methods.lora_siblings import group_siblings

    _, model = _pair()
    for layer in _layers(model):
        group_siblings(layer)
    _check(model, torch.randint(0, CFG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1)))


@pytest.mark.parametrize("family", ["qwen3moe", "gpt-oss"])
def test_expert_adapters_and_routers_scaled_by_zero_are_the_base(family):
    from test_expert_adapters import _pair

    _, model = _pair(family)
    _check(model, torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1)))
