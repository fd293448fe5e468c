"""Activation offload (`offload: activations`): the same training, with the saved activations held off the device.

On the CPU the "host copies" are clones (nothing is saved there): these tests check the bookkeeping — what is
offloaded, what stays, what comes back, in which order — and that training is unchanged. The overlap and the
memory it frees are measured on a GPU (benchmarks/results/qlora-lora.md)."""

import pytest
import torch

from tunebench import RunConfig, run
from tunebench.dist import SINGLE
from tunebench.engine import offload
from tunebench.errors import UserError
from tunebench.run_preflight import preflight
from tunebench.runner import Outcome, build_trainable

BASE = dict(model="tiny-llama", steps=4, warmup=1, seq_len=32, batch_size=2, lr=3e-3, device="cpu", precision="fp32",
            telemetry=False)


def _trainable(**fields):
    plan = preflight(RunConfig(**BASE | fields))
    return build_trainable(plan, Outcome(), SINGLE), plan


def _grads(t, ids, saving=None) -> tuple[float, list[torch.Tensor]]:
    t.module.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks
    if saving is None:
        loss = t.module(ids, ids.roll(-1, 1))
    else:
        with saving.forward():
            loss = t.module(ids, ids.roll(-1, 1))
    loss.backward()
    return loss.item(), [p.grad.clone() for p in t.module.parameters() if p.grad is not None]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: "
                                                                "run on one, see benchmarks/results/qlora-lora.md"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fields", [dict(method="full"), dict(method="lora"),
                                    dict(method="lora", grad_ckpt=True, compile=True)],
                         ids=["full", "lora", "lora-ckpt-compiled"])
def test_gradients_equal_with_the_saved_activations_offloaded(fields, device, request):
    """On a GPU: the copies on their own streams, the tensors' memory reused while training goes on (and
    inductor's code; on the CPU the compiled graphs' saved tensors without its code generation)."""
    if device == "cpu":
        request.getfixturevalue("no_codegen")
    t, plan = _trainable(**fields, device=device)
    ids = torch.randint(0, plan.spec.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0)).to(device)
    loss, grads = _grads(t, ids)
    saving = offload.ActivationOffload(torch.device(device), t.module.parameters(), min_bytes=0)
    loss2, grads2 = _grads(t, ids, saving)
    assert loss2 == loss
    assert len(grads2) == len(grads) and all(torch.equal(a, b) for a, b in zip(grads, grads2))
    # everything but the newest LAG entries went to the "host"; each came back and its device copy was let go
    assert len(saving.entries) > offload.LAG and saving.offloaded_bytes > 0
    assert sum(e.gpu is not None or e.back is not None for e in saving.entries) == 0


def test_compiled_checkpointed_blocks_offload_their_inputs_only(no_codegen):
    """Whole-block checkpointing, compiled: a block saves its input (and the rotary tables, shared by all blocks:
    one entry); the weights are never copied."""
    t, plan = _trainable(method="lora", grad_ckpt=True, compile=True)
    ids = torch.randint(0, plan.spec.vocab_size, (2, 32))
    saving = offload.ActivationOffload(torch.device("cpu"), t.module.parameters(), min_bytes=0)
    with saving.forward():
        loss = t.module(ids, ids.roll(-1, 1))
    hidden = (2, 32, plan.spec.hidden_size)
    block_inputs = [e for e in saving.entries if e.gpu is not None and tuple(e.gpu.shape) == hidden
                    or e.host is not None and tuple(e.host.shape) == hidden]
    assert len(block_inputs) >= plan.spec.num_layers  # each block's input (and the final norm's)
    params = {p.untyped_storage().data_ptr() for p in t.module.parameters()}
    kept = [e.gpu if e.gpu is not None else e.host for e in saving.entries]
    assert not any(k.untyped_storage().data_ptr() in params for k in kept)
    loss.backward()


def test_a_saved_tensor_changed_in_place_before_its_copy_is_an_error():
    saving = offload.ActivationOffload(torch.device("cpu"), [], min_bytes=0)
    x = torch.randn(8, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified in place"), saving.forward():
        a = x.exp()  # exp saves its output
        with torch.no_grad():
            a.add_(1)  # what autograd reports as an error at backward; caught here when the copy is made
        for i in range(offload.LAG):
            (x + i).sin()  # later saves: the first one's copy starts


def test_a_run_offloading_activations_trains_as_without(monkeypatch):
    made = []
    real = offload.ActivationOffload.__init__

    def spy(self, device, params, min_bytes=None):
        real(self, device, params, min_bytes=0)
        made.append(self)
    monkeypatch.setattr(offload.ActivationOffload, "__init__", spy)
    plain = run(RunConfig(**BASE, method="lora", grad_ckpt=True))
    held = run(RunConfig(**BASE, method="lora", grad_ckpt=True, offload="activations"))
    assert plain.status == held.status == "ok", held.error
    assert held.metrics.losses == plain.metrics.losses
    assert len(made) == 1 and made[0].offloaded_bytes > 0


@pytest.mark.parametrize("strategy", ["fsdp", "zero2"])
def test_offloading_activations_is_refused_where_not_built(strategy):
    with pytest.raises(UserError, match="offloaded under single or ddp"):
        preflight(RunConfig(**BASE, method="lora", strategy=strategy, nproc_per_node=2, offload="activations"))


def test_a_second_backward_through_one_forward_is_refused_clearly():
    saving = offload.ActivationOffload(torch.device("cpu"), [], min_bytes=0)
    x = torch.randn(8, requires_grad=True)
    with saving.forward():
        y = (x + 1).exp()
        for i in range(offload.LAG + 1):
            y = (y + i).sin()
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.sum().backward()


def test_four_bit_weights_and_their_constants_are_never_copied():
    """bitsandbytes keeps a 4-bit weight's absmax and code beside the parameter: persistent, not activations."""
    t, _ = _trainable(method="qlora")
    persistent = {p.untyped_storage().data_ptr() for p in offload._persistent(t.module)}
    states = [p.quant_state for p in t.module.parameters() if getattr(p, "quant_state", None) is not None]
    assert states and all(qs.absmax.untyped_storage().data_ptr() in persistent for qs in states)
