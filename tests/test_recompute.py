"""Selective checkpointing (`ckpt_keep: matmuls`): the same training, and backward reruns no large matmul."""

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

from tunebench import RunConfig, run
from tunebench.dist import SINGLE
from tunebench.format import label
from tunebench.runner import Outcome, build_trainable, preflight

BASE = dict(model="tiny-llama", steps=4, warmup=1, seq_len=32, batch_size=2, lr=3e-3, device="cpu", precision="fp32",
            telemetry=False)


class _CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.matmuls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.matmuls += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return func(*args, **(kwargs or {}))


def _backward_matmuls(**fields) -> int:
    plan = preflight(RunConfig(**BASE | fields))
    t = build_trainable(plan, Outcome(), SINGLE)
    ids = torch.randint(0, plan.spec.vocab_size, (2, 32))
    loss = t.module(ids, ids.roll(-1, 1))
    with _CountMatmuls() as count:
        loss.backward()
    return count.matmuls


@pytest.mark.parametrize("model", ["tiny-llama", "tinygpt-124m"])
def test_backward_reruns_no_matmul(model):
    """Kept outputs are not recomputed: backward runs the matmuls of no checkpointing, full recompute runs more."""
    shape = dict(model=model) if model == "tiny-llama" else dict(model=model, seq_len=16)
    none = _backward_matmuls(method="full", **shape)
    kept = _backward_matmuls(method="full", grad_ckpt=True, ckpt_keep="matmuls", **shape)
    whole = _backward_matmuls(method="full", grad_ckpt=True, **shape)
    assert kept == none < whole


def test_lora_reruns_only_its_up_projections():
    """With LoRA, only the adapters' rank-r up-projections (wide outputs nothing in backward needs) run again."""
    targets = ["q_proj", "v_proj"]
    fields = dict(method="lora", lora_rank=4, lora_targets=targets)
    none = _backward_matmuls(**fields)
    kept = _backward_matmuls(grad_ckpt=True, ckpt_keep="matmuls", **fields)
    whole = _backward_matmuls(grad_ckpt=True, **fields)
    # one up-projection per target per block (two blocks); and no input gradient for the first block, whose
    # input (the frozen embeddings' output) needs none
    assert kept == none + len(targets) * 2 < whole


@pytest.mark.parametrize("method", ["full", "lora"])
def test_keeping_matmuls_trains_as_without_checkpointing(method):
    none = run(RunConfig(**BASE, method=method))
    kept = run(RunConfig(**BASE, method=method, grad_ckpt=True, ckpt_keep="matmuls"))
    assert none.status == kept.status == "ok", kept.error
    assert kept.metrics.losses == pytest.approx(none.metrics.losses, rel=1e-5)
    assert label(kept).endswith("ckpt+mm") and "+mm" not in label(none)
    # no matmul runs twice: the hardware FLOPs are the model FLOPs, as without checkpointing
    assert kept.metrics.hfu_flops_per_token == pytest.approx(none.metrics.hfu_flops_per_token)


def test_keeping_matmuls_compiled_trains_as_eager():
    """Inside a compiled block the checkpoint is traced: torch.compile's recompute follows the policy."""
    eager = run(RunConfig(**BASE, method="lora", grad_ckpt=True, ckpt_keep="matmuls"))
    counters.clear()
    compiled = run(RunConfig(**BASE, method="lora", grad_ckpt=True, ckpt_keep="matmuls", compile=True))
    assert compiled.status == "ok", compiled.error
    # the checkpoint is inside the graph (traced from our frame), not run eagerly around it: a frame per block
    # shape compiled, no graph break
    assert counters["frames"]["ok"] >= 1 and not counters["graph_break"]
    assert compiled.metrics.compile_scope == "blocks"
    assert compiled.metrics.losses == pytest.approx(eager.metrics.losses, rel=1e-4)


def test_keeping_matmuls_needs_checkpointing():
    with pytest.raises(ValueError, match="ckpt_keep=matmuls .* needs grad_ckpt"):
        RunConfig(ckpt_keep="matmuls")


def test_cli_flag(tb):
    code, _, err = tb("run", "--model", "tiny-llama", "--device", "cpu", "--ckpt-keep", "matmuls", "--no-store")
    assert code == 2 and "needs grad_ckpt" in err and "Traceback" not in err


def test_evaluation_runs_without_the_checkpoint():
    """Under no_grad (a train job's evaluation) the block runs plainly, with the same outputs."""
    ids = torch.randint(0, 1024, (2, 32))
    losses = []
    for fields in ({}, {"grad_ckpt": True, "ckpt_keep": "matmuls"}):
        t = build_trainable(preflight(RunConfig(**BASE | {"method": "lora"} | fields)), Outcome(), SINGLE)
        with torch.no_grad():
            losses.append(t.module(ids, ids.roll(-1, 1)).item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
