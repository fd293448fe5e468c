"""Selective checkpointing (`ckpt_keep: matmuls`): the same training, and backward reruns no large matmul."""

from collections import Counter

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

from tunebench import RunConfig, run
from tunebench.dist import SINGLE
from tunebench.format import label
from tunebench.run_preflight import preflight
from tunebench.runner import Outcome, build_trainable

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


def test_keeping_matmuls_compiled_trains_as_eager(no_codegen):
    """Inside a compiled block the checkpoint is traced: torch.compile's recompute follows the policy."""
    eager = run(RunConfig(**BASE, method="lora", grad_ckpt=True, ckpt_keep="matmuls"))
    torch._dynamo.reset()  # frames an earlier test compiled would be reused, not counted
    counters.clear()
    compiled = run(RunConfig(**BASE, method="lora", grad_ckpt=True, ckpt_keep="matmuls", compile=True))
    assert compiled.status == "ok", compiled.error
    # the checkpoint is inside the graph (traced from our frame), not run eagerly around it: a frame per block
    # shape compiled, no graph break
    assert counters["frames"]["ok"] >= 1 and not counters["graph_break"]
    assert compiled.metrics.compile_scope == "blocks"
    assert compiled.metrics.losses == pytest.approx(eager.metrics.losses, rel=1e-4)


def test_keeping_matmuls_in_one_checkpointed_block_of_n():
    """ckpt_keep_every=2: the first of tiny-llama's two blocks keeps its matmuls, the second recomputes its
    forward: half of full recompute's extra matmuls, the same training, the planner between the two."""
    from tunebench.engine.model import transformer_blocks
    from tunebench.engine.recompute import checkpointed_whole, keeps_matmuls
    from tunebench.gpus import match
    from tunebench.plan import predict

    none = _backward_matmuls(method="full")
    half = _backward_matmuls(method="full", grad_ckpt=True, ckpt_keep="matmuls", ckpt_keep_every=2)
    whole = _backward_matmuls(method="full", grad_ckpt=True)
    assert half - none == (whole - none) / 2 > 0
    plan = preflight(RunConfig(**BASE, grad_ckpt=True, ckpt_keep="matmuls", ckpt_keep_every=2))
    blocks = transformer_blocks(build_trainable(plan, Outcome(), SINGLE).model, plan.spec.num_layers)
    assert [(keeps_matmuls(b), checkpointed_whole(b)) for b in blocks] == [(True, False), (False, True)]
    base = run(RunConfig(**BASE))
    partial = run(RunConfig(**BASE, grad_ckpt=True, ckpt_keep="matmuls", ckpt_keep_every=2))
    assert partial.status == "ok", partial.error
    assert partial.metrics.losses == pytest.approx(base.metrics.losses, rel=1e-5)
    assert label(partial).endswith("ckpt+mm/2")
    # the planner: memory and speed between keeping every block's matmuls and none (Mistral-7B QLoRA, 32 blocks;
    # Hugging Face's checkpoint, without the traced one's transient in backward, which makes no step of the dial)
    gpu, q = match("H200"), dict(model="mistral-7b", method="qlora", seq_len=512, batch_size=8, grad_ckpt=True,
                                  compile=True, optimizer="paged_adamw_8bit", ckpt_traced=False)
    p = [predict(RunConfig(**q, **k), gpu) for k in ({}, dict(ckpt_keep="matmuls", ckpt_keep_every=4),
                                                     dict(ckpt_keep="matmuls", ckpt_keep_every=2),
                                                     dict(ckpt_keep="matmuls"))]
    peaks = [x.mem.peak_allocated for x in p]
    assert peaks == sorted(peaks) and len(set(peaks)) == 4
    speeds = [x.tokens_per_s for x in p]
    assert speeds == sorted(speeds) and len(set(speeds)) == 4
    # one block in four keeps (8 of 32): a quarter of the way, in memory, from recomputing all to keeping all
    assert peaks[1] - peaks[0] == pytest.approx((peaks[3] - peaks[0]) / 4, rel=0.05)


def test_keeping_matmuls_in_one_block_of_n_needs_keeping_matmuls():
    with pytest.raises(ValueError, match="ckpt_keep_every=2 .* needs ckpt_keep=matmuls"):
        RunConfig(grad_ckpt=True, ckpt_keep_every=2)
    with pytest.raises(ValueError, match="ckpt_traced=false .* needs grad_ckpt"):
        RunConfig(ckpt_traced=False)
    assert RunConfig().config_hash() == RunConfig(ckpt_keep_every=1).config_hash()


def test_keeping_matmuls_needs_checkpointing():
    with pytest.raises(ValueError, match="ckpt_keep=matmuls .* needs grad_ckpt"):
        RunConfig(ckpt_keep="matmuls")


def test_cli_flag(tb):
    code, _, err = tb("run", "--model", "tiny-llama", "--device", "cpu", "--ckpt-keep", "matmuls", "--no-store")
    assert code == 2 and "needs grad_ckpt" in err and "Traceback" not in err


def test_evaluation_runs_without_the_checkpoint(no_codegen):
    """Under no_grad (a train job's evaluation) the block runs plainly, with the same outputs."""
    ids = torch.randint(0, 1024, (2, 32))
    losses = []
    for fields in ({}, {"grad_ckpt": True, "ckpt_keep": "matmuls"}, {"grad_ckpt": True, "compile": True}):
        t = build_trainable(preflight(RunConfig(**BASE | {"method": "lora"} | fields)), Outcome(), SINGLE)
        with torch.no_grad():
            losses.append(t.module(ids, ids.roll(-1, 1)).item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6) and losses[0] == pytest.approx(losses[2], rel=1e-4)


def _saved_activations(plan, t) -> Counter:
    """Shapes of what one micro-batch's forward keeps for backward (how many of each), parameters and buffers
    apart (held anyway)."""
    params = {p.data_ptr() for p in (*t.module.parameters(), *t.module.buffers())}
    shapes: Counter = Counter()

    def pack(x):
        if x.data_ptr() not in params and x.dim() >= 2:
            shapes[tuple(x.shape)] += 1
        return x

    ids = torch.randint(0, plan.spec.vocab_size, (2, 33), device=plan.device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        loss = t.module(ids[:, :-1], ids[:, 1:])
    loss.backward()
    return shapes


def test_whole_block_checkpoint_traced_in_compiled_blocks(no_codegen):
    """ckpt_traced (the default): a compiled block recomputed whole has its checkpoint inside, traced by compile:
    the same training as Hugging Face's checkpoint, one graph per block, the same FLOPs counted."""
    from tunebench.engine.model import transformer_blocks
    from tunebench.engine.recompute import recomputes_traced

    for fields in (dict(method="lora"), dict(method="full", precision="bf16", float8="tensorwise")):
        # float8 too: torchao's matmuls keep nothing the checkpoint drops (on an H200, benchmarks/results/full-finetune.md)
        plan = preflight(RunConfig(**BASE | fields, grad_ckpt=True, compile=True))
        blocks = transformer_blocks(build_trainable(plan, Outcome(), SINGLE).model, plan.spec.num_layers)
        assert all(recomputes_traced(b) and not b.gradient_checkpointing for b in blocks)
    eager = run(RunConfig(**BASE, method="lora", grad_ckpt=True))
    torch._dynamo.reset()  # frames an earlier test compiled would be reused, not counted
    counters.clear()
    traced = run(RunConfig(**BASE, method="lora", grad_ckpt=True, compile=True))
    assert traced.status == "ok", traced.error
    assert counters["frames"]["ok"] >= 1 and not counters["graph_break"]
    assert traced.metrics.losses == pytest.approx(eager.metrics.losses, rel=1e-4)
    assert traced.metrics.hfu_flops_per_token == pytest.approx(eager.metrics.hfu_flops_per_token)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no GPU: run on one, see benchmarks/results/qlora-lora.md"))])
def test_traced_blocks_keep_only_their_input(device, request):
    """QLoRA in compiled blocks recomputed whole: the forward keeps of each block only what Hugging Face's
    checkpoint keeps, its input. (On an H200, 4-bit layers inside an autograd function made the partitioner keep
    each block's bf16 weights, 9.5 GiB on Mistral-7B; the CPU's graphs did not show it.)"""
    from tunebench.engine.model import transformer_blocks
    from tunebench.engine.recompute import checkpointed_whole, recomputes_traced

    if device == "cpu":  # what the partitioner keeps; inductor's code is the GPU variant's
        request.getfixturevalue("no_codegen")
    saved = {}
    for traced in (True, False):
        plan = preflight(RunConfig(**BASE | dict(precision="bf16" if device == "cpu" else "auto", device=device),
                                   method="qlora", grad_ckpt=True, compile=True, ckpt_traced=traced))
        t = build_trainable(plan, Outcome(), SINGLE)
        blocks = transformer_blocks(t.model, plan.spec.num_layers)
        assert all(recomputes_traced(b) == traced and checkpointed_whole(b) for b in blocks)
        layers = [m for b in blocks for m in b.modules() if hasattr(m, "recomputed")]
        assert all(m.recomputed for m in layers) and len(layers) == 7 * len(blocks) if traced else not layers
        for _ in range(2):  # the second after compiling
            saved[traced] = _saved_activations(plan, t)
    # what the traced blocks keep beyond Hugging Face's checkpoint: only their other input, the rotary tables
    assert saved[True] - saved[False] == Counter({(1, BASE["seq_len"], plan.spec.head_dim): 2 * len(blocks)})
    assert not saved[False] - saved[True]
