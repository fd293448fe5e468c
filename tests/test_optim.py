"""The packed bitsandbytes step (engine.optim): exactly the per-tensor update, in one call, and resumable."""

import pytest
import torch

from tunebench.config import RunConfig
from tunebench.engine.optim import build_optimizer, packed

bnb = pytest.importorskip("bitsandbytes")

# LoRA-like shapes (multiples of 256 elements, above the 8-bit minimum), one of another dtype, and two that stay
# apart: too small for 8-bit states, and a size that is no whole number of 256-element blocks
SHAPES = [((16, 512), torch.float32), ((512, 16), torch.float32), ((16, 256), torch.float32),
          ((16, 512), torch.bfloat16), ((16, 512), torch.bfloat16), ((3, 5), torch.float32), ((61, 97), torch.float32)]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: "
                                                                "run on one, see benchmarks/RESULTS.md"))]


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
def test_packed_state_saved_and_loaded_continues_exactly():
    cls = packed(bnb.optim.PagedAdamW8bit)
    whole = _params()
    opt = cls(whole, lr=1e-2)
    _steps(opt, whole, range(6))
    first = _params()
    opt1 = cls(first, lr=1e-2)
    _steps(opt1, first, range(3))
    state = opt1.state_dict()
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    opt2 = cls(resumed, lr=1e-2)
    opt2.load_state_dict(state)
    _steps(opt2, resumed, range(3, 6))
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed))


def test_adapters_are_packed_a_full_model_is_not():
    params = _params()
    for method, optimizer, name in (("lora", "paged_adamw_8bit", "PackedPagedAdamW8bit"),
                                    ("qlora", "adamw_8bit", "PackedAdamW8bit"),
                                    ("full", "paged_adamw_8bit", "PagedAdamW8bit"),
                                    ("lora", "adamw_fused", "AdamW")):
        cfg = RunConfig(model="tiny-llama", method=method, optimizer=optimizer, device="cpu")
        assert type(build_optimizer(params, cfg)).__name__ == name
