"""`mlp_chunk`: a block's MLP run a slice of tokens at a time, keeping only its input; the same values and gradients
as the MLP run whole, the same training, and nothing of the MLP's intermediates kept for backward."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP

from tunebench import RunConfig, run
from tunebench.dist import SINGLE
from tunebench.engine.chunked_mlp import chunk_mlps, run_chunked
from tunebench.errors import UserError
from tunebench.run_preflight import preflight
from tunebench.runner import Outcome, build_trainable

BASE = dict(model="tiny-llama", steps=4, warmup=1, seq_len=32, batch_size=2, lr=3e-3, device="cpu", precision="fp32",
            telemetry=False)


class _Holder(torch.nn.Module):
    def __init__(self, mlp: torch.nn.Module):
        super().__init__()
        self.mlp = mlp


def _lora_mlp(dropout: float) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=88, hidden_act="silu")
    model = get_peft_model(_Holder(LlamaMLP(cfg)), LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                                                              target_modules=["gate_proj", "up_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # non-zero adapters: their gradients and the input's depend on them
            torch.nn.init.normal_(p, std=0.1)
    return model.train()


def _values_and_grads(model: torch.nn.Module, x: torch.Tensor, g: torch.Tensor, chunk: int | None):
    mlp = model.base_model.model.mlp
    weights = [p for p in mlp.parameters() if p.requires_grad]
    x = x.detach().requires_grad_()
    torch.manual_seed(1)  # dropout's masks drawn alike
    if chunk is None:
        y = mlp(x)
    elif chunk < 0:  # slices with autograd: dropout's masks drawn slice by slice, as the chunked MLP draws them
        y = torch.cat([mlp(part) for part in x.reshape(-1, x.shape[-1]).split(-chunk)]).view(x.shape)
    else:
        y = run_chunked(mlp.forward, chunk, x, weights)
    y.backward(g)
    grads = [x.grad] + [p.grad.clone() for p in weights]
    for p in weights:
        p.grad = None
    return y.detach(), grads


@pytest.mark.parametrize("chunk", [1, 7, 40, 1000])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_values_and_gradients_equal_the_whole_mlps(chunk, dropout):
    """Slices that do not divide the tokens, one token, more than all of them; LoRA with dropout in training mode
    (its masks are drawn slice by slice: the reference is the slices run with autograd, whose gradients hold only if
    backward draws the forward's masks again)."""
    model = _lora_mlp(dropout)
    x, g = torch.randn(3, 13, 32), torch.randn(3, 13, 32)
    want, want_grads = _values_and_grads(model, x, g, -chunk if dropout else None)
    got, got_grads = _values_and_grads(model, x, g, chunk)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert len(got_grads) == 7  # the input and three adapters' A and B
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_under_autocast_the_mlp_computes_in_bf16_and_its_weights_get_fp32_gradients():
    model = _lora_mlp(0.0)
    x, g = torch.randn(2, 24, 32), torch.randn(2, 24, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, want_grads = _values_and_grads(model, x, g, None)
        got, got_grads = _values_and_grads(model, x, g, 10)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for a, b in zip(got_grads, want_grads):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)


def test_the_mlp_keeps_only_its_input():
    model = _lora_mlp(0.0)
    mlp = model.base_model.model.mlp
    chunk_mlps([model.base_model.model], 8)
    x = torch.randn(2, 64, 32, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = mlp(x)
    assert [t.shape for t in saved] == [x.shape]  # gate, up, their product: none kept
    y.sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in mlp.parameters() if p.requires_grad)
    with torch.no_grad():  # evaluation: nothing kept, the same values
        torch.testing.assert_close(mlp(x), y.detach())


@pytest.mark.parametrize("fields", [dict(method="full"), dict(method="lora", grad_ckpt=True),
                                    dict(method="full", objective="dpo")])
def test_training_takes_the_losses_of_the_whole_mlp(fields):
    """Full fine-tuning (the MLP's own weights through the function), LoRA under checkpointing (the block's forward
    runs again in backward, the MLP's a third time), DPO's frozen reference (its MLPs chunked without gradients).
    (With dropout the masks are drawn slice by slice, another draw than the whole MLP's: the slices' own gradients
    are checked above.)"""
    whole = run(RunConfig(**BASE | fields))
    chunked = run(RunConfig(**BASE | fields | dict(mlp_chunk=10)))
    assert chunked.status == "ok", chunked.error
    assert chunked.metrics.losses == pytest.approx(whole.metrics.losses, rel=1e-5)
    assert chunked.config["mlp_chunk"] == 10


def test_every_block_mlp_is_chunked_and_backward_reruns_it():
    plan = preflight(RunConfig(**BASE | dict(method="lora", mlp_chunk=16)))
    t = build_trainable(plan, Outcome(), SINGLE)
    mlps = [m for m in t.model.modules() if getattr(m, "mlp_chunk", None)]
    assert len(mlps) == plan.spec.num_layers and all(m.mlp_chunk == 16 for m in mlps)


@pytest.mark.parametrize("fields,why", [
    (dict(strategy="fsdp", nproc_per_node=1, method="lora"), "under single or ddp"),
    (dict(model="mixtral-8x7b", method="lora"), "no dense MLP"),
])
def test_refused_where_it_cannot_run(fields, why):
    with pytest.raises(UserError, match=why):
        preflight(RunConfig(**BASE | fields | dict(mlp_chunk=8)))


@pytest.mark.parametrize("fields,why", [(dict(grad_ckpt=True, ckpt_keep="matmuls"), "ckpt_keep=matmuls"),
                                        (dict(compile_scope="model"), "compile_scope=model")])
def test_refused_with_what_it_contradicts(fields, why):
    with pytest.raises(ValueError, match=why):
        RunConfig(**BASE | fields | dict(mlp_chunk=8))


def test_the_planner_counts_one_chunk_of_the_mlp_and_its_forward_again():
    from tunebench.api.plan import plan

    base = dict(model="llama-3.1-8b", method="qlora", lora_rank=32, batch_size=1, seq_len=65536, grad_ckpt=True)
    whole, chunked = (plan(RunConfig(**base | extra), gpu="H100-80GB") for extra in ({}, dict(mlp_chunk=8192)))
    # a block keeps none of the MLP's intermediates (4 x 14336 bytes a token compiled); its input is the norm's
    # output, counted with the norms
    assert whole.mem.activations.per_layer - chunked.mem.activations.per_layer == pytest.approx(4 * 14336)
    assert chunked.mem.peak_allocated < 0.75 * whole.mem.peak_allocated
    assert chunked.tokens_per_s < whole.tokens_per_s  # one more MLP forward a step
    assert chunked.workload.chunked_mlp == 8192 and whole.workload.chunked_mlp == 0


def test_offload_reuses_its_host_buffers_at_their_exact_sizes():
    """engine.offload's host pool: a buffer given back is taken again for a tensor of as many bytes (another dtype
    too), never rounded up (torch's pinned allocator rounds to a power of two)."""
    from tunebench.engine.offload import HostPool

    pool = HostPool()
    made = []
    pool._new = lambda n: made.append(n) or torch.empty(n, dtype=torch.uint8)  # the CPU's stand-in for a pinned one
    a = pool.take(torch.Size([3, 5]), torch.bfloat16)
    address = a.data_ptr()
    pool.give(a)
    b = pool.take(torch.Size([15]), torch.float16)
    c = pool.take(torch.Size([3, 5]), torch.bfloat16)
    assert b.data_ptr() == address and c.data_ptr() != address and made == [30, 30]
    assert b.shape == (15,) and b.dtype == torch.float16
    pool.give(b)
    pool.next_step()  # b's buffer was taken in the step before: kept
    assert pool.free[30] and pool.take(torch.Size([15]), torch.float16).data_ptr() == address
    pool.give(c)
    pool.next_step()
    pool.next_step()  # c's buffer not taken for a whole step: released (shapes that changed do not pile up)
    assert not pool.free[30]
