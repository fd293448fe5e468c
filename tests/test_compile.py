"""torch.compile's two scopes: what each strategy gets, and the whole-model graph (loss included) training as eager does."""

import pytest
import torch

from tunebench import RunConfig, choices, run
from tunebench.flags import config_from, parse_run
from tunebench.format import label
from tunebench.gpus import match
from tunebench.plan import predict
from tunebench.report.views import run_table
from tunebench.strategies import STRATEGIES


@pytest.mark.parametrize("strategy,method,scope,expected", [
    ("single", "full", "auto", "model"),  # full fine-tuning without checkpointing: the whole model
    ("single", "full", "model", "model"),
    ("single", "lora", "auto", "blocks"),
    ("ddp", "full", "auto", "model"),
    ("ddp", "full", "model", "model"),  # dynamo cuts the graph at DDP's buckets
    ("fsdp", "full", "auto", "blocks"),
    ("single", "full", "blocks", "blocks"),
    ("single", "qlora", "model", "model"),
])
def test_scope_chosen_per_strategy(strategy, method, scope, expected):
    cfg = RunConfig(strategy=strategy, method=method, compile=True, compile_scope=scope)
    assert choices.compile_scope(cfg, STRATEGIES[strategy]) == expected
    assert choices.resolve(cfg, STRATEGIES[strategy], "cuda").compile_scope == expected  # what the run reads
    assert choices.compile_scope(cfg.model_copy(update={"compile": False}), STRATEGIES[strategy]) is None


@pytest.mark.parametrize("update", [{"grad_ckpt": True}, {"float8": "tensorwise"}, {"offload": "activations"},
                                    {"method": "qlora"}])
def test_auto_scope_stays_per_block_where_the_whole_graph_was_not_measured_better(update):
    cfg = RunConfig(method="full", compile=True).model_copy(update=update)
    assert choices.compile_scope(cfg, STRATEGIES["single"]) == "blocks"
    assert choices.compile_scope(cfg.model_copy(update={"compile_scope": "model"}), STRATEGIES["single"]) == "model"


def test_whole_model_scope_refused_under_wrappers(tb):
    code, _, err = tb("run", "--model", "tiny-llama", "--device", "cpu", "--strategy", "fsdp", "--nproc-per-node", "2",
                      "--compile", "--compile-scope", "model", "--no-store")
    assert code == 2 and "compile_scope=model with strategy=fsdp" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_scope_keeps_config_hashes():
    """A field added later leaves the identity of configurations stored before it unchanged."""
    assert RunConfig(compile=True).config_hash() == RunConfig(compile=True, compile_scope="auto").config_hash()


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: run on one, see benchmarks/results/full-finetune.md")


@pytest.mark.parametrize("model,device", [("tiny-llama", "cpu"), pytest.param("tiny-llama", "cuda", marks=GPU),
                                          pytest.param("tinygpt-124m", "cuda", marks=GPU)])
def test_whole_model_compile_trains_as_eager(model, device, request):
    """Embeddings, blocks, norm and the fused loss in one graph: the same losses as eager, step by step (on a GPU
    through inductor's code; on the CPU the graph as traced and partitioned, without its code generation)."""
    if device == "cpu":
        request.getfixturevalue("no_codegen")
    cfg = RunConfig(model=model, method="full", steps=4, warmup=1, seq_len=32, batch_size=2, lr=3e-3,
                    device=device, precision="fp32", telemetry=False, dropout=0.0)
    eager = run(cfg if device == "cpu" else cfg.model_copy(update={"compile": False}))
    whole = run(cfg.model_copy(update={"compile": True, "compile_scope": "model"}))
    assert eager.status == whole.status == "ok", whole.error
    assert len(whole.metrics.losses) == 4
    # the first loss is one forward of the same weights; later ones carry the graph's other rounding through lr 3e-3
    # updates (1.2e-3 apart at step 3 on the CPU of the GPU machine, 16 cores)
    assert whole.metrics.losses[0] == pytest.approx(eager.metrics.losses[0], rel=1e-5)
    assert whole.metrics.losses == pytest.approx(eager.metrics.losses, rel=5e-3)
    # compiling is counted in setup and shown apart, never in a step time
    if device == "cpu":  # compile=auto is eager on the CPU
        assert eager.config["compile"] == "auto" and eager.metrics.compile_scope is None
        assert eager.metrics.compile_s is None and "compile" not in label(eager)
    assert whole.metrics.compile_scope == "model" and label(whole).endswith(" compile")
    assert 0.5 < whole.metrics.compile_s <= whole.metrics.setup_s
    assert whole.metrics.step_time_s.p99 < whole.metrics.compile_s  # not in the timed steps
    assert any("compiled per model" in cell for row in run_table(whole).rows for cell in row)


@pytest.mark.parametrize("update,device,expected", [
    ({}, "cuda", True),  # a full fine-tune compiled whole in one process on a GPU
    ({"grad_accum": 4, "batch_size": 1}, "cuda", True),
    ({}, "cpu", False),
    ({"cuda_graphs": False}, "cuda", False),
    ({"strategy": "ddp"}, "cuda", False),  # DDP's hooks run between the graph's pieces
    ({"compile_scope": "blocks"}, "cuda", False),
    ({"compile": False}, "cuda", False),
    ({"grad_ckpt": True}, "cuda", False),  # compiled per block
    ({"grad_ckpt": True, "compile_scope": "model"}, "cuda", False),  # whole, but never measured so
    ({"method": "lora", "compile_scope": "model"}, "cuda", False),
])
def test_cuda_graphs_auto_only_where_they_were_measured(update, device, expected):
    cfg = RunConfig(model="tinygpt-124m", method="full").model_copy(update=update)
    strategy = STRATEGIES[cfg.strategy]
    assert choices.resolve(cfg, strategy, device).cuda_graphs is expected
    if device == "cuda":  # the planner makes the same choice
        assert predict(cfg, match("H100"), 2 if cfg.strategy == "ddp" else 1).cfg.cuda_graphs is expected
    if expected:  # as asked, either way
        assert choices.resolve(cfg.model_copy(update={"cuda_graphs": False}), strategy, device).cuda_graphs is False


@pytest.mark.parametrize("flags,message", [
    (("--strategy", "ddp"), "cuda_graphs=true with strategy=ddp: CUDA graphs replay the whole model's graph in one"),
    (("--no-compile",), "cuda_graphs=true with compile=false"),
    (("--compile-scope", "blocks"), "cuda_graphs=true with compile_scope=blocks"),
    (("--method", "lora"), "cuda_graphs=true with compile_scope=auto"),  # auto compiles LoRA per block
    (("--compile-scope", "model", "--offload", "activations"), "cuda_graphs=true with offload=activations"),
])
def test_cuda_graphs_refused_where_nothing_replays_them(tb, flags, message):
    code, _, err = tb("plan", "--model", "tinygpt-124m", "--gpu", "h100", "--cuda-graphs", *flags)
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cuda_graphs_refused_on_the_cpu(tb):
    code, _, err = tb("run", "--model", "tiny-llama", "--device", "cpu", "--cuda-graphs", "--no-store")
    assert code == 2 and "invalid cuda_graphs=true: CUDA graphs need a CUDA GPU" in err and "Traceback" not in err


def test_cuda_graphs_of_older_records_were_off():
    """A record stored before the field ran its whole graph's kernels one by one: the planner is told so."""
    from tunebench.api.plan import what_ran
    from tunebench.record import ResultRecord

    rec = ResultRecord.for_config(RunConfig(model="tinygpt-124m"), {})
    old = rec.model_copy(update={"config": {k: v for k, v in rec.config.items() if k != "cuda_graphs"}})
    old.metrics.compile_scope = "model"
    assert what_ran(old)["cuda_graphs"] is False
    old.metrics.cuda_graphs = True
    assert what_ran(old)["cuda_graphs"] is True
    assert RunConfig().config_hash() == RunConfig(cuda_graphs="auto").config_hash()  # stored hashes unchanged


def test_gradients_kept_sum_micro_batches_as_freed_ones_do():
    """What CUDA graphs with accumulation run on (engine.step.torch_step's grads_kept): gradients that exist from
    the start, zeroed in place after each update, sum the micro-batches as gradients freed and made anew do."""
    from tunebench.engine.step import torch_step

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

        def forward(self, x, y):
            return torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    cfg = RunConfig(grad_accum=3, precision="fp32", grad_clip=0.5)
    batches = [(torch.randn(4, 8, generator=torch.Generator().manual_seed(k)), torch.randn(4)) for k in range(9)]
    trained = []
    for kept in (False, True):
        torch.manual_seed(0)
        module = Loss()
        params = list(module.parameters())
        ts = torch_step(module, params, torch.optim.SGD(params, lr=0.1, momentum=0.9), cfg, torch.device("cpu"),
                        grads_kept=kept)
        for step in range(3):
            for k in range(cfg.grad_accum):
                ts.micro(batches[step * cfg.grad_accum + k], k == cfg.grad_accum - 1)
            ts.update()
            assert all((p.grad is not None and not p.grad.any()) if kept else p.grad is None for p in params)
        trained.append([p.detach().clone() for p in params])
    for freed, kept in zip(*trained):
        torch.testing.assert_close(kept, freed, rtol=0, atol=1e-7)


@GPU
def test_cuda_graphs_train_as_launched_kernels_do():
    """The whole graph replayed as CUDA graphs: the same losses as its kernels launched one by one, with two
    micro-batches a step (a gradient taken from a graph's memory as .grad would be overwritten by the next
    micro-batch's replay: the sum came out as the last micro-batch's alone), and the graph really replayed."""
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    cfg = RunConfig(model="tinygpt-124m", method="full", steps=5, warmup=1, seq_len=64, batch_size=2, grad_accum=2,
                    lr=3e-3, device="cuda", precision="fp32", telemetry=False, dropout=0.0, compile=True)
    launched = run(cfg.model_copy(update={"cuda_graphs": False}))
    skipped = counters["inductor"]["cudagraph_skips"]
    replayed = run(cfg)
    assert launched.status == replayed.status == "ok", replayed.error
    assert replayed.metrics.cuda_graphs is True and launched.metrics.cuda_graphs is None
    assert counters["inductor"]["cudagraph_skips"] == skipped
    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    assert manager is not None and any(manager.roots.values())
    assert replayed.metrics.losses == pytest.approx(launched.metrics.losses, rel=1e-5)
    assert any("compiled per model, CUDA graphs in" in cell for row in run_table(replayed).rows for cell in row)


@GPU
def test_cuda_graphs_memory_counts_the_graphs_pools():
    """A replayed graph's tensors live in its private pool, which the allocator's allocated figure leaves out once
    the graph is recorded (GPT-2 small s512 b4 x 4 on an H100: 2.21 GiB reported against 3.19 launching its
    kernels). The peak counts the pools: never below the same run's with the kernels launched one by one."""
    cfg = RunConfig(model="tinygpt-124m", method="full", steps=6, warmup=3, seq_len=512, batch_size=4, grad_accum=2,
                    device="cuda", telemetry=False, compile=True)
    launched = run(cfg.model_copy(update={"cuda_graphs": False}))
    replayed = run(cfg)
    assert launched.status == replayed.status == "ok", replayed.error
    ratio = replayed.metrics.peak_mem_allocated_bytes / launched.metrics.peak_mem_allocated_bytes
    assert 0.97 <= ratio <= 1.3, ratio
    assert replayed.metrics.peak_mem_allocated_bytes <= replayed.metrics.peak_mem_reserved_bytes


@pytest.mark.parametrize("strategy,device,expected", [
    ("single", "cuda", True), ("ddp", "cuda", True), ("fsdp", "cuda", True), ("zero2", "cuda", True),
    ("zero3", "cuda", False),  # DeepSpeed's fetch hooks inside every block: never measured compiled
    ("single", "cpu", False), ("ddp", "cpu", False),
])
def test_compile_auto_is_on_for_gpu_training(strategy, device, expected):
    cfg, st = RunConfig(strategy=strategy), STRATEGIES[strategy]
    assert cfg.compile == "auto" and choices.resolve(cfg, st, device).compile is expected
    assert choices.resolve(RunConfig(strategy=strategy, compile=False), st, device).compile is False
    assert choices.resolve(RunConfig(strategy=strategy, compile=True), st, device).compile is True


@pytest.mark.parametrize("strategy,ckpt,batch,seq,expected", [
    ("zero2", False, 8, 2048, True), ("zero2", False, 4, 2048, True), ("zero2", False, 1, 2048, False),
    ("ddp", True, 2, 1024, False),  # checkpointed: compiled per block
    ("ddp", False, 1, 2048, True), ("single", False, 2, 1024, True), ("single", False, 8, 2048, True)])
def test_compile_auto_leaves_small_micro_batches_eager_per_block(strategy, ckpt, batch, seq, expected):
    """A GPT-2 block (7.1 M parameters) at 2048 tokens ran slower compiled per block (host-bound): auto keeps it
    eager there. The whole model as one graph (a full fine-tune without checkpointing under single or ddp) pays
    the host once a micro-batch and ran faster than eager at every size measured: auto compiles it."""
    from tunebench.models import resolve_model
    from tunebench.models.count import counts
    per_block = counts(resolve_model("tinygpt-124m")).per_block
    cfg = RunConfig(model="tinygpt-124m", strategy=strategy, batch_size=batch, seq_len=seq, grad_ckpt=ckpt)
    st = STRATEGIES[strategy]
    assert (choices.scope_if_compiled(cfg, st) == "model") is (strategy in ("single", "ddp") and not ckpt)
    assert choices.resolve(cfg, st, "cuda", per_block).compile is expected  # what run_preflight makes
    assert choices.resolve(cfg.model_copy(update={"compile": True}), st, "cuda", per_block).compile is True
    assert predict(cfg, match("H200"), 2 if strategy != "single" else 1).cfg.compile is expected  # as will run


@pytest.mark.parametrize("flags,expected", [
    ((), "auto"), (("--compile",), True), (("--no-compile",), False), (("--compile", "auto"), "auto"),
    (("--compile", "false"), False), (("--compile", "on", "--strategy", "ddp"), True),
])
def test_compile_flag_is_a_switch_that_takes_auto(flags, expected):
    assert config_from(parse_run(list(flags))).compile == expected


def test_compile_switch_before_the_config_file(tmp_path):
    """`run --compile run.yaml` (a switch, then the file) still reads the file."""
    (tmp_path / "run.yaml").write_text("model: tinygpt-124m\n")
    cfg = config_from(parse_run(["--compile", str(tmp_path / "run.yaml")]))
    assert cfg.compile is True and cfg.model == "tinygpt-124m"


def test_plan_predicts_auto_as_compiled_on_gpus():
    gpu = match("H100")
    auto, eager = (predict(RunConfig(model="tinygpt-124m", seq_len=2048, batch_size=8, compile=c), gpu, 1)
                   for c in ("auto", False))
    assert auto.cfg.compile is True and eager.cfg.compile is False
    assert auto.tokens_per_s > eager.tokens_per_s and auto.mem.peak_allocated < eager.mem.peak_allocated


def test_whole_sequences_reach_sdpa_without_a_mask_when_traced():
    """Traced, transformers builds a dense mask for every row; our rows of whole sequences reach SDPA with
    is_causal and no mask (its causal kernels), packed rows with their mask."""
    import torch
    import torch.nn.functional as F

    from tunebench.engine.model import CausalLMWithLoss
    from tunebench.models import build_model, resolve_model

    model, _ = build_model(resolve_model("tiny-llama"), RunConfig(precision="fp32", device="cpu"), torch.device("cpu"))
    module = CausalLMWithLoss(model, 1024)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ids = torch.randint(0, 1024, (2, 16), generator=torch.Generator().manual_seed(0))
    packed = torch.cat([torch.arange(8), torch.arange(8)])[None].expand(2, -1)
    traced = torch.compile(module, backend=capture)
    for positions in (None, packed):
        graphs.clear()
        traced(ids, ids, positions)
        calls = [n for g in graphs for n in g.graph.nodes if n.target is F.scaled_dot_product_attention]
        assert len(calls) == 2  # one per layer
        masks = [n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None) for n in calls]
        if positions is None:
            assert all(m is None for m in masks) and all(n.kwargs.get("is_causal") for n in calls)
        else:
            assert all(m is not None for m in masks)


def test_compiled_model_keeps_packed_examples_apart():
    """Under torch.compile (where transformers always builds a mask) packed rows still see only their own example."""
    import torch

    from tunebench.models import build_model, resolve_model

    model, _ = build_model(resolve_model("tiny-llama"), RunConfig(precision="fp32", device="cpu"), torch.device("cpu"))
    model.eval()
    assert model.config._attn_implementation == "sdpa_causal"
    compiled = torch.compile(model, backend="aot_eager")  # the mask is dynamo's trace; no code generation needed
    ids = torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(8), torch.arange(8)])[None]
    with torch.no_grad():
        together = compiled(input_ids=ids, position_ids=positions, use_cache=False).logits[0, 8:]
        alone = compiled(input_ids=ids[:, 8:], use_cache=False).logits[0]
        whole = compiled(input_ids=ids, use_cache=False).logits[0]
        eager = model(input_ids=ids, use_cache=False).logits[0]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(whole, eager, atol=1e-5, rtol=1e-4)
    assert (whole[8:] - alone).abs().max() > 1e-3  # causal over the whole row: the second half sees the first
