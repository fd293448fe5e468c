"""tunebench plan: predictions checked against every GPU record we measured, against the real models'
parameters and saved activations on the CPU, and the command's output and errors."""

import importlib
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import cli_subprocess, counting_model
from tunebench.api.plan import prediction_for, run_config, what_ran
from tunebench.api.records import finalize
from tunebench.config import RunConfig
from tunebench.gpus import match
from tunebench.plan import Workload, predict, workload
from tunebench.plan.activations import activations
from tunebench.plan.calibration import CAL
from tunebench.plan.memory import memory, tied_gradient
from tunebench.record import ResultRecord
from tunebench.strategies import STRATEGIES

# the GPU records the planner is held to (tunebench run/train/hw records; their figures: benchmarks/results/)
DATA = Path(__file__).resolve().parent / "data" / "planner"
MEMORY_GOAL, SPEED_GOAL = 0.05, 0.15
# The largest error allowed a throughput prediction; looser where the planner says the host bounds the step: the
# host's speed moves from lease to lease (GPT-2 small s512 b16 compiled whole on H100s: 265,172-354,183 tokens/s)
SPEED_BOUND, HOST_BOUND_SPEED_BOUND = 0.25, 0.30
# ... and for `train` jobs, whose packed rows (several examples each) the planner does not model: in fp32 they carry
# an attention mask, so SDPA cannot take its causal kernel (GPT-2 small s1024 b4 x 2 tf32 on an H100: 107,518
# tokens/s packed, predicted 30% faster; 129,615 unpacked, 8%); in bf16 they take the variable-length flash kernel
# (312,482 packed, predicted 16% faster; 331,988 unpacked, 10%)
TRAIN_JOB_SPEED_BOUND = 0.35
PADDED_LOSS_SINCE = "2026-11-22T03:40"  # GPU runs from then on pad GPT-2's 50,257-row head in the loss
FUSED_4BIT_SINCE = "2026-11-22T13:45"  # QLoRA blocks keeping matmuls keep the 4-bit ones too (models.nf4) from then
# the loss's softmax compiled on GPUs from then (engine.loss): before, it held 12 bytes per logit of a chunk
LOSS_COMPILED_SINCE = "2026-11-22T15:35"
# whole-model runs before then computed a zero loss gradient (torch 2.11, engine.loss): withdrawn, shown apart
WHOLE_GRAPH_MENDED = "2026-11-23T11:08"
# one graph kept no fp32 head gradient from the forward before then: it summed every group's product at once
HEAD_GRAD_IN_PLACE_SINCE = "2026-11-24T03:00"
# one graph traced the loss's in-place softmax before then, which held one fp32 chunk of logits per chunk, up to
# WHOLE_GRAPH_FP32_CHUNKS, beside the chunk's 16-bit logits (benchmarks/probes/memory_probe.py --peak-live, H100)
LOSS_PURE_IN_GRAPH_SINCE = "2026-11-24T04:00"
# runs replaying CUDA graphs reported the allocator's allocated peak before then, which leaves out the graphs' pools
GRAPH_POOLS_COUNTED_SINCE = "2026-11-24T06:30"
# ZeRO-2 full fine-tunes recorded before then (H200s, 2026-11-21 and 22) ran without the per-step cost the H100
# runs of 2026-11-27 show (strategies: zero2's full_step_s); what changed between them, the engine or the machine,
# is not profiled yet
ZERO2_STEP_COST_SINCE = "2026-11-27"
# ZeRO-2 in bf16 without DeepSpeed's per-tensor overflow check (strategies.zero): from then, a host cost per trained
# tensor (DeepSpeed's gradient hooks) and none after backward; before, the step's 30 ms after backward
ZERO2_CHECK_DROPPED_SINCE = "2026-11-28T06:30"
# FSDP2 under bf16-pure reduce-scattered fp32 gradients before then; since, bf16 ones (strategies.fsdp)
FSDP_PURE_REDUCE_BF16_SINCE = "2026-11-28T09:45"
# a full fine-tune's head under a preference objective ran as checkpointed chunks with an eager fp32 softmax before
# then (slower: benchmarks/results/preference.md); since, log-probabilities alone in forward and the fused loss's
# pass in backward (engine.preference)
PREFERENCE_HEAD_FUSED_SINCE = "2026-11-28T13:05"
WHOLE_GRAPH_FP32_CHUNKS = 4
# train jobs' evaluations computed the loss's gradients (7.79 GiB against 6.15 for GPT-2 small) before the first,
# and kept every weight's bf16 copy (32.95 GiB against 31.14 for Llama-3.2-1B) before the second
EVALUATION_LEAN_SINCE = "2026-11-25T19:45"
# fp32 with grouped keys (Llama-3.2-1B) ran SDPA's math kernel before then, its S x S probabilities kept: not modelled
FP32_KEYS_REPEATED_SINCE = "2026-11-24T08:00"
# LoRA on an MoE's experts went through peft's rebuilt expert weights before then (methods.expert_adapters): that
# engine is gone and the planner no longer models it; shown apart
EXPERT_ADAPTERS_GROUPED_SINCE = "2026-11-27T11:00"
# the GPU terms (and DDP's and FSDP2's overlap within a node) refit on profiles of the engine as it runs since then
# (benchmarks/probes/planner_terms.py), the first records they fit being the 7-8B LoRA and QLoRA runs of that
# afternoon; earlier records ran slower steps (Mistral-7B QLoRA s512 b8 checkpointed: 9,358 tokens/s on an H200 on
# 2026-11-22, 12,045 on an H100 on 2026-11-26) and are planned with the constants they were fitted on
TERMS_REFIT_SINCE = "2026-11-26T12:00"
TERMS_BEFORE = {"attention_of_peak": 0.95, "attention_half_seq": 4096, "narrow_head_attention_share": 1.0,
                "softcap_attention_slowdown": 1.0, "traced_recompute_fused": 1.0, "experts_elementwise_share": 1.0,
                "autocast_cast_bytes_per_param": 0.0, "autocast_grad_bytes_per_param": 0.0,
                "gemm_peak_share": 0.93, "adapter_matmul_share": 0.15,
                "elementwise_bytes": {("gpt2", False): 8.6, ("gpt2", True): 3.0, ("llama", False): 8.8,
                                      ("llama", True): 5.1}}
plan_memory = importlib.import_module("tunebench.plan.memory")  # the module (the package exports its function)
plan_speed = importlib.import_module("tunebench.plan.speed")
HEAD_GRAD_KEPT, LOSS_BYTES_PER_LOGIT = plan_memory.head_grad_kept, plan_memory.loss_bytes_per_logit  # as they are now


def _head_grad_kept_before(w) -> float:
    """plan.memory.head_grad_kept before HEAD_GRAD_IN_PLACE_SINCE: one graph kept none from the forward."""
    return 0.0 if w.whole_graph else HEAD_GRAD_KEPT(w)


def _loss_bytes_before_pure(w) -> int:
    """plan.memory.loss_bytes_per_logit before LOSS_PURE_IN_GRAPH_SINCE."""
    if w.whole_graph and w.fused_head:
        return w.compute_bytes + 4 * min(-(-w.tokens // plan_memory.chunk_rows(w)), WHOLE_GRAPH_FP32_CHUNKS)
    return LOSS_BYTES_PER_LOGIT(w)


def _records(kind: str) -> list[ResultRecord]:
    recs = []
    for f in sorted(DATA.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            raw = json.loads(line)
            if raw.get("kind") == kind and raw.get("schema_version"):
                recs.append(ResultRecord.model_validate(raw))
    return recs


def test_predictions_against_every_gpu_record(capsys, monkeypatch, request):
    """The validation table: predicted vs measured peak memory and tokens/s per GPU, every GPU run we made
    (printed under `pytest -v`)."""
    newest_first = sorted(_records("hw"), key=lambda r: r.created_at, reverse=True)  # as api.plan.measured_hw
    hw = [(match(r.environment["gpu"]["name"]), r.id[:12], r.metrics.model_dump()) for r in newest_first]
    runs = [r for r in _records("train") if r.status == "ok" and r.environment.get("device") == "cuda"]
    assert len(runs) >= 50
    mem_err, tps_err, tps_over, lines = [], [], [], []
    cold = apart = 0
    for r in runs:
        gpu = match(r.environment["gpu"]["name"])
        with monkeypatch.context() as then:  # each record against the engine it ran: the loss as it was then
            cal = CAL if r.created_at >= TERMS_REFIT_SINCE else replace(CAL, **TERMS_BEFORE)
            then.setattr(plan_speed, "CAL", cal)
            if r.created_at < TERMS_REFIT_SINCE:  # every recompute's matmuls counted in full then, collectives hidden
                then.setattr(Workload, "residual_matmul", 0)
                for name in ("ddp", "fsdp"):
                    facts = STRATEGIES[name].planner
                    then.setitem(STRATEGIES, name, replace(STRATEGIES[name], planner=replace(facts, overlap_in_node=None)))
            if r.created_at < LOSS_COMPILED_SINCE:
                then.setattr(plan_memory, "loss_bytes_per_logit", lambda w: 12)
                then.setattr(plan_speed, "CAL", replace(cal, loss_bytes_per_logit=30))  # the eager softmax's passes
            elif r.created_at < LOSS_PURE_IN_GRAPH_SINCE:
                then.setattr(plan_memory, "loss_bytes_per_logit", _loss_bytes_before_pure)
            if r.created_at < HEAD_GRAD_IN_PLACE_SINCE:
                then.setattr(plan_memory, "head_grad_kept", _head_grad_kept_before)
            if r.created_at < PADDED_LOSS_SINCE:  # an odd vocabulary's head unpadded in the fused loss too
                then.setattr(plan_speed, "head_padded", lambda w: False)
            if r.config.get("strategy") == "zero2" and r.created_at < ZERO2_CHECK_DROPPED_SINCE:
                zero2 = STRATEGIES["zero2"]
                step_s = 30e-3 if r.created_at >= ZERO2_STEP_COST_SINCE else 0.0
                then.setitem(STRATEGIES, "zero2", replace(zero2, planner=replace(zero2.planner, full_step_s=step_s,
                                                                                host_per_tensor_s=0.0)))
            if r.created_at < FSDP_PURE_REDUCE_BF16_SINCE:
                then.setattr(Workload, "reduce_bytes", 4)
            cfg = run_config(what_ran(r))
            if "ckpt_traced" not in r.config:  # before the field: Hugging Face's checkpoint around every block
                cfg = cfg.model_copy(update={"ckpt_traced": False})
            evaluated = bool(r.metrics.job and r.metrics.job.eval_data)
            p = predict(cfg, gpu, r.metrics.world_size, [(i, m) for g, i, m in hw if g == gpu], evaluated)
        em = p.mem.peak_allocated / r.metrics.peak_mem_allocated_bytes - 1
        et = p.tokens_per_s / r.metrics.tokens_per_s - 1
        # the whole model compiled as one graph: its runs before the fused loss's gradient was mended there trained
        # nothing (withdrawn), shown apart; since, held to both goals
        whole_graph = r.metrics.compile_scope == "model" or (r.config.get("compile") is True
                                                               and r.config.get("compile_scope") == "model")
        whole = whole_graph and r.created_at < WHOLE_GRAPH_MENDED
        # GPT-2 runs between the loss's padding of the head and its compiled softmax: an eager loss over padded
        # logits, which the planner models neither way; shown, not held to the goals
        whole = whole or (r.config["model"] == "tinygpt-124m"
                          and PADDED_LOSS_SINCE <= r.created_at < LOSS_COMPILED_SINCE)
        # QLoRA keeping matmuls before its 4-bit layers were fused: they reran then, the planner models them kept
        before = (r.config["method"] == "qlora" and r.config.get("ckpt_keep") == "matmuls"
                  and r.created_at < FUSED_4BIT_SINCE)
        whole = whole or before
        wl = workload(cfg, r.metrics.world_size)
        spec = wl.spec
        math_fp32 = (cfg.precision == "fp32" and r.created_at < FP32_KEYS_REPEATED_SINCE
                     and (spec.shape.get("num_key_value_heads") or spec.num_heads) < spec.num_heads)
        whole = whole or math_fp32
        rebuilt = r.created_at < EXPERT_ADAPTERS_GROUPED_SINCE and any(t.kind == "experts" for t in wl.targets)
        whole = whole or rebuilt
        # a frozen float8 base's memory is predicted as bf16's (plan says so): its tokens/s held to the goal, its memory
        # shown; a full fine-tune's float8 blocks are counted (plan.activations)
        float8 = r.config.get("float8", "off") != "off" and r.config["method"] != "full"
        # ZeRO-3 with QLoRA: the memory of DeepSpeed's gathering of the packed 4-bit base is not modelled (plan
        # says so); its speed is
        zero3_qlora = r.config.get("strategy") == "zero3" and r.config["method"] == "qlora"
        uncounted = bool(r.metrics.cuda_graphs) and r.created_at < GRAPH_POOLS_COUNTED_SINCE
        # train jobs evaluating beside CUDA graphs' pools before evaluation's chunks were cut and its weight cache
        # dropped: their evaluation held the logits' gradients or every weight's bf16 copy, which it no longer does
        lean = bool(r.metrics.cuda_graphs and evaluated) and r.created_at < EVALUATION_LEAN_SINCE
        apart += whole
        if not whole and not float8 and not zero3_qlora and not uncounted and not lean:
            mem_err.append(abs(em))
        # tune trials of the first tunes ran 3 warmup steps: not yet steady (the same DDP configuration ran
        # 36% slower than in a full run); their throughput is shown, not held to the goal
        short = "tune" in r.tags and r.config["warmup"] < 5
        cold += short
        # held out and missed (issue 47, open), the throughput shown, not held: QLoRA with adapters on every expert at
        # a small batch waits on the host (profiled: benchmarks/results/families.md); without checkpointing, an MoE's
        # routing; a preference objective's trained head before its fused pass (benchmarks/results/preference.md);
        # LoRA DPO under FSDP2, host-bound where planned GPU-bound (profiled: benchmarks/results/preference.md)
        full = r.config["method"] == "full"
        missed = ("QLoRA on every expert at batch 4: the step waits on the host, which the planner has GPU-bound"
                  if r.config["method"] == "qlora" and wl.experts and r.config["batch_size"] < 8
                  and any(t.kind == "experts" for t in wl.targets) else
                  "MoE QLoRA without checkpointing: routing's kernels cost more than the dense blocks' share fitted"
                  if r.config["method"] == "qlora" and wl.experts and not r.config["grad_ckpt"]
                  and r.created_at >= TERMS_REFIT_SINCE else
                  "a preference objective's trained head through eager checkpointed chunks then"
                  if full and cfg.preference and r.created_at < PREFERENCE_HEAD_FUSED_SINCE else
                  "LoRA DPO under FSDP2: host-bound, each process at its host's speed; planned GPU-bound" if not full and cfg.preference and r.config.get("strategy") == "fsdp" else "")
        if not short and not whole and not missed:
            tps_err.append(abs(et))
            bound = (TRAIN_JOB_SPEED_BOUND if r.metrics.job else HOST_BOUND_SPEED_BOUND if p.time.bound == "host"
                     else SPEED_BOUND)
            tps_over.append(abs(et) / bound)
        c = r.config
        compiled = r.metrics.compile_scope or c["compile"] is True  # records before compile_scope: the flag
        lines.append(f"{gpu.name:9} {c['model']:13} {c['method']:5} {c.get('strategy', 'single'):6} "
                     f"x{r.metrics.world_size} b{c['batch_size']}x{c['grad_accum']} s{c['seq_len']:<5}"
                     f"{' ckpt' if c['grad_ckpt'] else '     '}{' compile' if compiled else '        '}{(' tf32' if cfg.tf32 else ' fp32') if cfg.precision == 'fp32' else ''}"
                     f"{' f8-' + c['float8'][:3] if c.get('float8', 'off') != 'off' else '       '} "
                     f"memory {r.metrics.peak_mem_allocated_bytes / 2**30:6.2f} GiB predicted "
                     f"{p.mem.peak_allocated / 2**30:6.2f} ({em:+6.1%})   tokens/s {r.metrics.tokens_per_s:9,.0f} "
                     f"predicted {p.tokens_per_s:9,.0f} ({et:+6.1%}){'  (short tune trial)' if short else ''}"
                     f"{'  (before the 4-bit layers kept their matmuls)' if before else ''}"
                     f"{'  (fp32 grouped keys: SDPA math kernel then)' if math_fp32 else ''}"
                     f"{'  (not modelled: whole-model compile, padded GPT-2 loss still eager)' if whole and not before and not math_fp32 and not rebuilt else ''}"
                     f"{'  (LoRA on the experts through peft rebuilt weights then)' if rebuilt else ''}"
                     f"{'  (QLoRA under ZeRO-3: memory not modelled)' if zero3_qlora else ''}"
                     f"{'  (a frozen float8 base: memory predicted as bf16)' if float8 else ''}"
                     f"{'  (CUDA graphs: their pools left out of the memory measured)' if uncounted else ''}"
                     f"{'  (evaluated beside CUDA graphs before evaluation was made lean)' if lean else ''}"
                     f"{f'  ({missed}; open)' if missed else ''}")
    within_mem = sum(e <= MEMORY_GOAL for e in mem_err)
    within_tps = sum(e <= SPEED_GOAL for e in tps_err)
    if request.config.getoption("verbose") > 0:  # the table under `pytest -v`; quiet under -q
        with capsys.disabled():
            print(f"\nplanner vs {len(runs)} GPU runs in tests/data/planner: peak memory within 5% on {within_mem} of "
                  f"{len(mem_err)}, tokens/s within 15% on {within_tps} of {len(tps_err)} ({cold} short tune trials and "
                  f"{apart} whole-model compiled, eager-padded-loss GPT-2, earlier QLoRA-keeping-matmuls and fp32 "
                  "math-kernel runs shown apart; a frozen float8 base's and ZeRO-3 QLoRA's memory too)")
            print("\n".join(lines))
    assert max(mem_err) <= 0.12, "a memory prediction is off by more than 12%"
    assert within_mem >= 0.9 * len(mem_err)
    assert max(tps_over) <= 1, "a throughput prediction is off by more than 25% (30% where the host bounds it)"
    assert within_tps >= 0.9 * len(tps_err)


def _param_bytes(model: torch.nn.Module) -> int:
    total = 0
    for p in {id(p): p for p in model.parameters()}.values():
        total += p.numel() * p.element_size()
        qs = getattr(p, "quant_state", None)
        if qs is not None:  # the absmax (and its own absmax) travel with a 4-bit weight
            total += qs.absmax.numel() * qs.absmax.element_size()
            if qs.state2 is not None:
                total += qs.state2.absmax.numel() * qs.state2.absmax.element_size()
    return total


@pytest.mark.parametrize("precision", ["bf16", "bf16-pure"])
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_weights_and_adapters_match_the_built_model(method, precision):
    from tunebench.engine.model import count_params
    from tunebench.methods import apply_method
    from tunebench.models import build_model, resolve_model

    cfg = RunConfig(model="tiny-llama", method=method, precision=precision, lora_targets=["q_proj", "down_proj"])
    model, _ = build_model(resolve_model(cfg.model), cfg, torch.device("cpu"))
    model = apply_method(model, cfg)
    w = workload(cfg, 1)
    plan = memory(w)
    weights = sum(i.bytes for i in plan.items if i.name.startswith(("weights", "LoRA", "quantization", "master")))
    assert w.trainable == count_params(model)[1]
    assert weights == pytest.approx(_param_bytes(model), rel=0.02 if method == "qlora" else 1e-9)


@pytest.mark.parametrize("precision", ["bf16", "bf16-pure"])
@pytest.mark.parametrize("method", ["full", "lora"])
def test_gradients_and_optimizer_states_match_a_step(method, precision):
    """After one real step: the gradients' and AdamW's bytes are what the planner counts (bf16-pure: half)."""
    from tunebench.engine.model import CausalLMWithLoss
    from tunebench.engine.optim import build_optimizer
    from tunebench.engine.step import autocast
    from tunebench.methods import apply_method
    from tunebench.models import build_model, resolve_model

    cfg = RunConfig(model="tiny-llama", method=method, precision=precision, optimizer="adamw_fused")
    model, _ = build_model(resolve_model(cfg.model), cfg, torch.device("cpu"))
    model = apply_method(model, cfg).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_optimizer(params, cfg)
    ids = torch.randint(0, 1024, (2, 64))
    with autocast(cfg, torch.device("cpu")):
        CausalLMWithLoss(model, 1024)(ids, ids).backward()
    opt.step()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params)
    states = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if t.dim() > 0)
    plan = memory(workload(cfg, 1))
    assert plan.item("gradients") == grads
    assert plan.item("optimizer states") == states


def _tiny_model_dir(path: Path, family: str = "llama", layers: int = 2) -> str:
    path.mkdir()
    cfg_json = ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
                 "intermediate_size": 704, "num_hidden_layers": layers, "num_attention_heads": 8,
                 "num_key_value_heads": 4} if family == "llama" else
                {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 256, "n_layer": layers,
                 "n_head": 8, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
    (path / "config.json").write_text(json.dumps(cfg_json | {"vocab_size": 512, "max_position_embeddings": 1024,
                                                             "n_positions": 1024}))
    return str(path)


def _saved_per_token(model, seq: int, autocast: bool = False) -> float:
    """Bytes per token that autograd keeps for the second block (parameters left out), batch 2 x `seq`."""
    from tunebench.engine.model import CausalLMWithLoss, transformer_blocks

    blocks = transformer_blocks(model, 2)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    inside = [False]
    blocks[1].register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
    blocks[1].register_forward_hook(lambda *a: inside.__setitem__(0, False))

    def pack(t):
        st = t.untyped_storage()
        if inside[0] and st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    ids = torch.randint(0, 512, (2, seq))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        CausalLMWithLoss(model, 512)(ids, ids)
    return sum(seen.values()) / (2 * seq)


@pytest.mark.parametrize("precision,strategy", [
    ("bf16", "zero2"),  # DeepSpeed runs bf16 without autocast
    ("bf16-pure", "single"),  # bf16 weights, no autocast
    ("fp32", "single"),
])
def test_block_activations_match_what_autograd_saves(tmp_path, monkeypatch, precision, strategy):
    """Without autocast (DeepSpeed's bf16, bf16-pure, or fp32) the CPU saves what the GPU saves: counted per block
    (fp32's grouped keys repeated as on a GPU, models.attention)."""
    from tunebench.models import attention, resolve_model
    from tunebench.models.build import Weights, build, train_weights

    monkeypatch.setattr(attention, "repeats_kv", lambda query: query.element_size() == 4)
    path = _tiny_model_dir(tmp_path / "llama")
    cfg = RunConfig(model=path, precision=precision, strategy=strategy, seq_len=256, compile=False)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16  # what the engine (or DeepSpeed) trains
    assert strategy != "single" or train_weights(cfg).dtype == dtype
    model, _ = build(resolve_model(path), Weights(dtype=dtype), torch.device("cpu"))
    measured = _saved_per_token(model.train(), 256)
    w = workload(cfg, 1)
    assert not w.autocast
    assert activations(w).per_layer == pytest.approx(measured, rel=0.03)


def _compiled_kept_per_token(model) -> float:
    """Bytes per token autograd keeps for backward (parameters left out) when the model with its loss runs
    compiled, batch 2 x 128."""
    from tunebench.engine.model import CausalLMWithLoss

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, 512, (2, 128), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch.compile(CausalLMWithLoss(model.train(), 512))(ids, ids)
    return sum(kept.values()) / ids.numel()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_fp32_compiled_activations_match_what_autograd_saves(tmp_path, monkeypatch, family, no_codegen):
    """fp32 compiled as one graph: what the partitioner keeps for backward, per block (a model of two blocks less
    one of one), is what plan.activations counts; grouped keys repeated as on a GPU (models.attention). The
    partitioner's choice, without inductor's code generation."""
    from tunebench.models import attention, resolve_model
    from tunebench.models.build import Weights, build

    monkeypatch.setattr(attention, "repeats_kv", lambda query: True)
    saved = []
    for layers in (1, 2):
        path = _tiny_model_dir(tmp_path / str(layers), family, layers)
        model, _ = build(resolve_model(path), Weights(dtype=torch.float32), torch.device("cpu"))
        saved.append(_compiled_kept_per_token(model))
    cfg = RunConfig(model=path, precision="fp32", compile=True, compile_scope="model", seq_len=128, dropout=0.0)
    assert activations(workload(cfg, 1)).per_layer == pytest.approx(saved[1] - saved[0], rel=0.01)


def test_float8_blocks_keep_float8_copies_where_bf16_kept_bf16(tmp_path, no_codegen):
    """A full fine-tune's compiled Llama block with torchao's float8 linears (on the CPU through torch's _scaled_mm)
    keeps fewer bytes a token than bf16's, by what plan.activations counts: the partitioner's float8 copies where
    bf16's were (bf16 weights, as FSDP2 gathers them)."""
    from tunebench.models import resolve_model
    from tunebench.models.build import Weights, build
    from tunebench.models.float8 import to_float8

    def kept_per_token(layers: int, float8: str) -> float:
        torch._dynamo.reset()
        model, _ = build(resolve_model(_tiny_model_dir(tmp_path / f"{float8}{layers}", "llama", layers)),
                         Weights(dtype=torch.bfloat16), torch.device("cpu"))
        if float8 != "off":
            to_float8(model, float8, fsdp_all_gather=False)
        return _compiled_kept_per_token(model)

    fewer = [kept_per_token(2, f) - kept_per_token(1, f) for f in ("off", "tensorwise")]
    path = _tiny_model_dir(tmp_path / "plan", "llama", 2)
    bf16, f8 = (activations(workload(RunConfig(model=path, method="full", precision="bf16", compile=True, float8=f,
                                                compile_scope="blocks", seq_len=128), 1))
                for f in ("off", "tensorwise"))
    assert f8.float8_fewer == 3 * 256 + 2 * 704 and bf16.float8_fewer == 0
    assert bf16.per_layer - f8.per_layer == f8.float8_fewer
    assert fewer[0] - fewer[1] == pytest.approx(f8.float8_fewer, rel=0.02)


@pytest.mark.parametrize("autocast", [True, False])
def test_lora_block_activations_match_what_autograd_saves(tmp_path, autocast):
    """LoRA on a bf16 base, under autocast with fp32 adapters (single, DDP, FSDP2) or all bf16 without autocast
    (DeepSpeed's bf16 engine casts the adapters too): neither keeps a copy of an adapter's input."""
    from tunebench.methods import apply_method
    from tunebench.models import resolve_model
    from tunebench.models.build import Weights, build

    path = _tiny_model_dir(tmp_path / "llama")
    cfg = RunConfig(model=path, method="lora", precision="bf16", seq_len=256, batch_size=2, compile=False,
                    strategy="single" if autocast else "zero2")
    model, _ = build(resolve_model(path), Weights(dtype=torch.bfloat16), torch.device("cpu"))
    model = apply_method(model, cfg)
    model = model.train() if autocast else model.to(torch.bfloat16).train()
    measured = _saved_per_token(model, 256, autocast)
    w = workload(cfg, 1)
    assert w.autocast == autocast
    assert activations(w).per_layer == pytest.approx(measured, rel=0.04)


def test_plan_prints_the_verdict_breakdown_and_time(tb):
    code, out, err = tb("plan", "--model", "mistral-7b", "--method", "qlora", "--seq-len", "1024", "--batch-size", "4",
                        "--grad-ckpt", "--optimizer", "paged_adamw_8bit", "--gpu", "H100-80GB", "--no-store")
    assert code == 0, err
    for words in ("verdict", "fits:", "NF4 block linears", "quantization constants", "LoRA adapters",
                  "paged", "activations", "CUDA context", "tokens/s", "MFU", "GPU: matmul", "spec sheet"):
        assert words in out, words


def test_plan_json_uses_the_record_metric_names(tb):
    code, out, _ = tb("plan", "--model", "llama-3-8b", "--strategy", "fsdp", "--nproc-per-node", "4",
                      "--seq-len", "4096", "--batch-size", "2", "--grad-ckpt", "--gpu", "H200", "--json", "--no-store")
    p = json.loads(out)
    assert code == 0 and p["world_size"] == 4 and p["verdict"] == "fits"
    assert {"peak_mem_allocated_bytes", "tokens_per_s", "tokens_per_s_per_gpu", "step_time_s"} <= set(p)
    names = [i["name"] for i in p["breakdown"]["memory"]]
    assert "unsharded blocks" in names and "optimizer states" in names
    assert p["peak_mem_allocated_bytes"] == max(p["breakdown"]["phases"].values())


def test_a_peak_that_fits_only_with_the_allocators_cache_trimmed_is_tight():
    """Qwen3-30B-A3B LoRA on every linear, s512 b8, checkpointed, ran on an H100 at 73.10 GiB allocated and 73.69
    reserved (tests/data/planner/2026-11-27-h100-expert-lora.jsonl): its planned peak with the eager reserve (8%)
    needs more than 80 GB, but PyTorch's allocator frees its cached blocks and retries before it runs out of
    memory. Tight, not "does not fit"; with the floor's reserve too much, "does not fit"."""
    cfg = RunConfig(model="qwen3-30b-a3b", method="lora", lora_targets="all-linear", seq_len=512, batch_size=8,
                    grad_ckpt=True)
    p = predict(cfg, match("H100"), 1)
    assert p.mem.total > p.hw.gpu.memory_bytes >= p.mem.least
    assert p.verdict == "tight" and p.fits
    assert predict(cfg.model_copy(update={"batch_size": 64}), match("H100"), 1).verdict == "does not fit"


def test_plan_verdicts_follow_the_gpu(tb):
    big = ("plan", "--model", "mistral-7b", "--method", "full", "--seq-len", "2048", "--batch-size", "4",
           "--json", "--no-store")
    on_h200 = json.loads(tb(*big, "--gpu", "H200")[1])
    on_l4 = json.loads(tb(*big, "--gpu", "L4")[1])
    assert on_l4["verdict"] == "does not fit" and on_l4["fits"] is False
    assert on_h200["peak_mem_allocated_bytes"] == on_l4["peak_mem_allocated_bytes"]  # memory needs no GPU figures
    assert on_h200["tokens_per_s"] > 5 * on_l4["tokens_per_s"]


def test_plan_compare_lists_strategies_and_refusals(tb):
    code, out, _ = tb("plan", "--model", "mistral-7b", "--method", "qlora", "--precision", "bf16-pure", "--gpu",
                      "H100-80GB", "--compare", "--gpus", "1,2", "--json", "--no-store")
    rows = json.loads(out)
    assert code == 0
    assert {(r["strategy"], r["world_size"]) for r in rows} >= {("single", 1), ("ddp", 2), ("fsdp", 2)}
    zero2 = next(r for r in rows if r["strategy"] == "zero2")
    assert zero2["prediction"] is None and "precision=bf16-pure" in zero2["refused"]
    ddp = {r["world_size"]: r["prediction"] for r in rows if r["strategy"] == "ddp"}
    assert ddp[2]["tokens_per_s"] > 1.5 * ddp[1]["tokens_per_s"]
    # FSDP2 shards QLoRA's base (4.0 GB on Mistral-7B): half leaves each GPU, less the root and blocks it gathers
    fsdp = next(r for r in rows if r["strategy"] == "fsdp" and r["world_size"] == 2)["prediction"]
    assert 1.2e9 < ddp[2]["peak_mem_allocated_bytes"] - fsdp["peak_mem_allocated_bytes"] < 2.0e9


def test_plan_offloaded_optimizer_moves_masters_and_adam_to_the_host(tb):
    """offload=optimizer: the 8B full fine-tune that needs ~180 GiB on one GPU fits in about 22 (measured 22.06 on an
    H200); the host holds 16 bytes per parameter (fp32 master, Adam's two moments, the fp32 gradient)."""
    args = ("plan", "--model", "llama-3-8b", "--strategy", "zero3", "--nproc-per-node", "1", "--seq-len", "4096",
            "--batch-size", "2", "--grad-ckpt", "--gpu", "H200", "--json", "--no-store")
    kept, off = (json.loads(tb(*args, *extra)[1]) for extra in ((), ("--offload", "optimizer")))
    assert kept["verdict"] == "does not fit" and off["verdict"] == "fits"
    names = {i["name"]: i["bytes"] for i in off["breakdown"]["memory"]}
    assert "master weights" not in names and names["optimizer states"] == 0 and names["gradients"] == 0
    assert off["breakdown"]["host_bytes"] == 16 * 8_030_261_248
    assert off["peak_mem_allocated_bytes"] / 2**30 == pytest.approx(22.06, rel=0.05)
    assert off["step_time_s"] > 3 * kept["step_time_s"]  # the host's step: CPU Adam over 8B parameters


def test_plan_reads_a_train_config(tb, tmp_path):
    (tmp_path / "train.yaml").write_text("model: tiny-llama\nmethod: lora\ndata: corpus.txt\nseq_len: 256\n"
                                         "batch_size: 4\nepochs: 2\n")
    (tmp_path / "corpus.txt").write_text("hello\n")
    code, out, err = tb("plan", str(tmp_path / "train.yaml"), "--gpu", "A100-40GB", "--json", "--no-store")
    assert code == 0, err
    assert json.loads(out)["gpu"] == "A100-40GB"


@pytest.mark.parametrize("args, message", [
    (("--gpu", "H300"), "unknown GPU 'H300': known GPUs are B200,"),
    ((), "no GPU detected on this machine: name the GPU to plan for with --gpu"),
    (("--gpu", "H100", "--model", "gpt-neox-20b"), "invalid model=gpt-neox-20b"),
    (("--gpu", "H100\nrm -rf /"), "unknown GPU 'H100\\nrm -rf /'"),  # one printable line, not "contains H100"
    (("--gpu", "H100", "--compare", "--strategies", "ddp,bogus"), "invalid strategies=bogus: choose from single,"),
    (("--gpu", "H100", "--strategy", "fsdp", "--compile", "--compile-scope", "model"),
     "invalid compile_scope=model with strategy=fsdp"),
])
def test_plan_bad_input_is_one_line(tb, args, message):
    code, _, err = tb("plan", *args, "--no-store")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


HELD_OUT_FILES = ("oos", "unseen", "plancheck")  # the out-of-sample checks: never fitted on


def _gpu_runs(files) -> dict[str, dict]:
    return {raw["id"][:12]: raw for f in files for raw in map(json.loads, f.read_text().splitlines())
            if raw.get("kind") == "train" and raw.get("environment", {}).get("device") == "cuda"
            and raw.get("status") in ("ok", "oom")}


def test_validation_reports_the_fitted_runs_apart_from_the_held_out(capsys, request):
    """`plan --validate` over the repository's GPU runs: those its constants were fitted on (plan/fitted_records.txt)
    apart from those held out from any fit, each with the hw records and from the spec sheet; no verdict wrong."""
    from tunebench.api.validate import fitted_ids, tables, validate
    from tunebench.console import print_table

    held = _gpu_runs(f for f in DATA.glob("*.jsonl") if any(h in f.name for h in HELD_OUT_FILES))
    every = _gpu_runs(DATA.glob("*.jsonl"))
    assert held and not set(held) & fitted_ids() and fitted_ids() <= set(every)
    v = validate(DATA)
    assert v.spec_sheet is not None and len(v.spec_sheet) == len(v.checks) == len(every)
    for checks in (v.checks, v.spec_sheet):
        assert {c.record.id[:12] for c in checks if c.set == "held out"} == set(held)
        assert {c.record.id[:12] for c in checks if c.set == "fitted"} == fitted_ids()
        assert not [c.label for c in checks if c.verdict_wrong]
    if request.config.getoption("verbose") > 0:
        with capsys.disabled():
            for table in tables(v):
                print_table(table)


def test_validation_of_a_users_own_runs(tb, tmp_path):
    """A user's runs are held out; a run that ran out of memory is held to its verdict only, and a 'fits' for it
    is counted wrong; CPU runs are not planned; bad sources are one line."""
    fitted_id, raw = next(iter(_gpu_runs(sorted(DATA.glob("*-h100-*.jsonl"))).items()))
    mine = dict(raw, id="f" * 32)
    small_oom = dict(raw, id="e" * 32, status="oom")  # planned to fit, yet it ran out of memory: a wrong verdict
    huge_oom = json.loads(json.dumps(raw))
    huge_oom.update(id="d" * 32, status="oom")
    huge_oom["config"].update(model="llama-3-8b", method="full", batch_size=64, seq_len=4096, grad_ckpt=False,
                              strategy="single")
    cpu = dict(raw, id="c" * 32, environment=dict(raw["environment"], device="cpu"))
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (raw, mine, small_oom, huge_oom, cpu)))
    code, out, err = tb("plan", "--validate", str(path), "--json")
    assert code == 0, err
    rows = {r["record"][:12]: r for r in json.loads(out)["runs"]}
    assert set(rows) == {fitted_id, "f" * 12, "e" * 12, "d" * 12}
    assert rows[fitted_id]["set"] == "fitted" and rows["f" * 12]["set"] == "held out"
    assert rows["f" * 12]["memory_error"] == rows[fitted_id]["memory_error"] is not None
    assert rows["e" * 12]["verdict_wrong"] and rows["e" * 12]["memory_error"] is None
    assert rows["d" * 12]["verdict"] == "does not fit" and not rows["d" * 12]["verdict_wrong"]
    code, out, err = tb("plan", "--validate", str(tmp_path))  # a folder: the same runs, as tables
    assert code == 0 and "held out" in out and "fitted" in out and "(wrong)" in out, err
    (tmp_path / "cpu.jsonl").write_text(json.dumps(cpu) + "\n")
    for source, message in ((tmp_path / "gone", "no such file or folder"), (tmp_path / "cpu.jsonl", "no GPU run"),
                            ("", "invalid validate=''")):
        code, _, err = tb("plan", "--validate", str(source))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_plan_max_answers_the_largest_batch_context_and_model_that_fit(tb):
    """`plan --max`: the size answered fits (within 95% of the GPU) and the next one up does not."""
    from tunebench.models.presets import PRESETS
    from tunebench.plan import workload

    h100 = match("NVIDIA H100 80GB HBM3")
    cfg = RunConfig(model="llama-3.1-8b", method="qlora", seq_len=1024, batch_size=1, grad_ckpt=True)

    def verdict(c: RunConfig) -> str:
        return predict(c, h100, 1).verdict

    base = ("plan", "--model", "llama-3.1-8b", "--method", "qlora", "--seq-len", "1024", "--batch-size", "1",
            "--grad-ckpt", "--gpu", "H100-80GB", "--no-store", "--json")
    code, out, err = tb(*base, "--max", "batch")
    b = json.loads(out)["value"]
    assert code == 0 and b > 1, err
    assert verdict(cfg.model_copy(update={"batch_size": b})) == "fits"
    assert verdict(cfg.model_copy(update={"batch_size": b + 1})) != "fits"
    code, out, err = tb(*base, "--max", "seq-len")
    answer = json.loads(out)
    s = answer["value"]
    assert code == 0 and s % 128 == 0 and verdict(cfg.model_copy(update={"seq_len": s})) == "fits"
    assert verdict(cfg.model_copy(update={"seq_len": s + 128})) != "fits"
    # beside it, the longest with the long-context levers (the MLP in chunks, the inputs offloaded): here the
    # model's positions bound it, and the host memory it needs is said
    longer = answer["with_long_context_levers"]
    assert longer["options"] == "--mlp-chunk 8192 --offload activations" and longer["value"] > s  # what differs
    levers = cfg.model_copy(update={"seq_len": longer["value"], "mlp_chunk": 8192, "offload": "activations"})
    assert verdict(levers) == "fits" and longer["at_the_models_limit"] and longer["prediction"]["breakdown"]["host_bytes"] > 0
    code, out, err = tb(*base, "--max", "model-size")
    answer = json.loads(out)
    size = {n: workload(cfg.model_copy(update={"model": n}), 1).counts.total for n in PRESETS}
    assert code == 0 and verdict(cfg.model_copy(update={"model": answer["value"]})) == "fits"
    assert all(t["verdict"] != "fits" for t in answer["tried"] if size[t["size"]] > size[answer["value"]])
    code, out, err = tb(*base[:-1], "--max", "seq-len", "--offload", "activations")
    assert code == 0 and "the largest sequence length: 131,072" in out and "the model's own limit" in out, out
    code, out, err = tb(*base[:-1], "--max", "width")
    assert code == 2 and "invalid choice: 'width'" in err


def test_plan_data_counts_the_jobs_tokens_time_and_cost(tb, tmp_path):
    """`plan --data`: the data tokenized with the model's tokenizer, as train will (every example's tokens and its
    end-of-sequence), the job's steps from its rows, and their time and price on the GPU named."""
    from transformers import AutoTokenizer

    texts = counting_model(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path / "model")
    base = ("plan", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "text.jsonl"), "--seq-len", "64",
            "--batch-size", "4", "--epochs", "3", "--gpu", "H100-80GB", "--no-store")
    code, out, err = tb(*base, "--json")
    assert code == 0, err
    p = json.loads(out)
    job = p["job"]
    assert job["examples"] == len(texts)
    assert job["tokens"] == sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts)
    assert job["steps"] == 3 * (job["rows"] // 4)
    assert job["seconds"] == pytest.approx(job["steps"] * p["step_time_s"])
    assert job["cost"].startswith("$") and " on demand at " in job["cost"]
    code, out, err = tb(*base)
    assert code == 0 and f"the job: {len(texts)} examples" in out and f"{job['steps']} steps of 256 tokens" in out
    code, _, err = tb("plan", "--model", "tiny-llama", "--data", str(tmp_path / "text.jsonl"), "--gpu", "H100",
                      "--no-store")
    assert code == 2 and "has random weights and no tokenizer" in err and len(err.strip().splitlines()) == 1, err


def test_plan_never_imports_torch():
    probe = ("import sys; from tunebench.cli import main; "
             "code = main(['plan', '--model', 'llama-3-8b', '--gpu', 'H100-80GB', '--no-store']); "
             "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(code)")
    import subprocess

    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_stored_gpu_runs_carry_their_prediction():
    rec = next(r for r in _records("train") if r.config["model"] == "llama-3-8b")
    rec.metrics.predicted = None
    finalize(rec, None)
    p = rec.metrics.predicted
    assert p["gpu"] == "H200" and p["world_size"] == 4 and p["peak_phase"] == "backward"
    assert p["peak_mem_allocated_bytes"] == pytest.approx(rec.metrics.peak_mem_allocated_bytes, rel=0.05)
    cpu = ResultRecord.for_config(RunConfig(), {"device": "cpu", "gpu": {}})
    assert prediction_for(cpu) is None


def test_report_shows_predicted_against_measured(tmp_path):
    store, out = tmp_path / "r.db", tmp_path / "report"
    done = cli_subprocess("results", "merge", str(DATA / "2026-11-21-h200x4-scale8-llama8b.jsonl"), "--store",
                          str(store))
    assert done.returncode == 0, done.stderr
    done = cli_subprocess("report", "--store", str(store), "--out", str(out))
    assert done.returncode == 0, done.stderr
    md = (out / "report.md").read_text()
    assert "## Planner: predicted vs measured" in md and "over 13 runs" in md


def test_hybrid_sharding_keeps_gathers_inside_a_node():
    """HSDP (shard_size = GPUs per node): each GPU holds a node's share of the states, twice FSDP's over two nodes,
    and only gradient shards cross nodes, so a full fine-tune over two nodes is not network-bound as FSDP is."""
    gpu = match("H200")
    base = dict(model="llama-3-8b", strategy="fsdp", seq_len=4096, batch_size=2, grad_ckpt=True,
                optimizer="adamw_fused", nproc_per_node=8, nnodes=2, rdzv_endpoint="node0:29400")
    fsdp, hsdp = predict(RunConfig(**base), gpu, 16), predict(RunConfig(**base, shard_size=8), gpu, 16)
    weights = [next(i.bytes for i in p.mem.items if i.name == "weights") for p in (fsdp, hsdp)]
    assert weights[1] == pytest.approx(2 * weights[0])
    assert fsdp.time.bound == "network" and hsdp.time.bound == "GPU"
    assert hsdp.tokens_per_s > 2 * fsdp.tokens_per_s
    one_node = predict(RunConfig(**(base | dict(nnodes=1, rdzv_endpoint=None))), gpu, 8)
    assert hsdp.tokens_per_s / 16 <= one_node.tokens_per_s / 8 * 1.0001  # never faster per GPU than one node


def test_a_job_matches_only_benchmarks_of_its_compile_scope():
    """compile_scope 'auto' has meant per block and, for full fine-tuning since, the whole model: a stored run's
    scope is what it ran (its record says), a job's what its strategy makes of 'auto'."""
    from types import SimpleNamespace

    from tunebench.choices import resolve
    from tunebench.config.base import workload_key
    from tunebench.strategies import STRATEGIES

    def scope_made(cfg: RunConfig) -> RunConfig:  # the job as preflight resolves it on a GPU
        return resolve(cfg, STRATEGIES[cfg.strategy], "cuda")

    job = RunConfig(model="tinygpt-124m", method="full", compile=True, seq_len=2048, batch_size=8)
    assert scope_made(job).compile_scope == "model"
    assert scope_made(job.model_copy(update={"grad_ckpt": True})).compile_scope == "blocks"
    assert scope_made(job.model_copy(update={"compile": False})).compile_scope == "auto"

    def stored(ran: str, graphs: bool | None = None) -> dict:
        r = SimpleNamespace(config=job.model_copy(update={"compile": "auto"}).model_dump(),
                            metrics=SimpleNamespace(precision="bf16", compile_scope=ran, cuda_graphs=graphs))
        return what_ran(r)
    # the job as preflight makes it on a GPU: bf16, its whole graph replayed as CUDA graphs (cuda_graphs auto)
    ran = job.model_copy(update={"precision": "bf16", "cuda_graphs": True})
    key = workload_key(RunConfig, scope_made(ran).model_dump())
    assert workload_key(RunConfig, stored("model", True)) == key
    assert workload_key(RunConfig, stored("model")) != key  # its kernels launched one by one: another engine
    assert workload_key(RunConfig, stored("blocks")) != key
    launched = workload_key(RunConfig, scope_made(ran.model_copy(update={"cuda_graphs": False})).model_dump())
    assert workload_key(RunConfig, stored("model")) == launched


def test_a_slower_host_slows_a_host_bound_step_only():
    """hw.host's dispatch time scales the host's constants (measured on the H200 machine whose figure is the
    reference): the median of the store's figures for the GPU, since one host's varies ~10% from run to run."""
    from tunebench.plan.calibration import CAL
    from tunebench.plan.hardware import hardware

    REFERENCE_HOST_DISPATCH_US = CAL.reference_host_dispatch_us

    gpu = match("H200")
    slow = [(f"r{i}", {"host_dispatch_us": us * REFERENCE_HOST_DISPATCH_US}) for i, us in enumerate((2.2, 1.9, 2.0))]
    assert hardware(gpu).host_scale == 1.0 and hardware(gpu, slow).host_scale == pytest.approx(2.0)
    short = RunConfig(model="tinygpt-124m", seq_len=512, batch_size=4, compile=True, compile_scope="blocks")
    long = RunConfig(model="llama-3.2-1b", seq_len=4096, batch_size=4, compile=True)
    here, there = predict(short, gpu, 1), predict(short, gpu, 1, slow)
    assert here.time.bound == "host" and there.tokens_per_s == pytest.approx(here.tokens_per_s / 2, rel=1e-6)
    here, there = predict(long, gpu, 1), predict(long, gpu, 1, slow)  # GPU-bound: only the launch gaps grow
    assert here.time.bound == "GPU" and 0.97 < there.tokens_per_s / here.tokens_per_s < 1.0


def test_the_whole_graph_holds_the_loss_as_per_block():
    """One graph (benchmarks/probes/memory_probe.py --peak-live, H100): the loss's chunks as per block (the softmax's pure form
    traced) but each chunk's gradient written straight into its group's, the tied weight cast twice (+74 MiB), the
    head's fp32 gradient kept from the forward as per block (accumulated in place) once a second group of chunks
    follows the first, a bf16 copy of each block's fp32 residual (+269 MiB at 16,384 tokens)."""
    gpu = match("H100")
    cfg = RunConfig(model="tinygpt-124m", seq_len=2048, batch_size=8, compile=True, compile_scope="blocks")
    blocks, whole = (predict(c, gpu, 1).mem for c in (cfg, cfg.model_copy(update={"compile_scope": "model"})))
    w = workload(cfg.model_copy(update={"compile_scope": "model"}), 1)
    head = w.counts.head
    chunk_logits = plan_memory.chunk_rows(w) * w.spec.vocab_size  # a chunk's gradient written into its group's
    assert whole.item("loss chunk") - blocks.item("loss chunk") == pytest.approx(2 * head - 2 * chunk_logits)
    per_block = 2 * w.spec.hidden_size * w.tokens * w.layers
    assert whole.item("activations") - blocks.item("activations") == pytest.approx(per_block)
    assert whole.peak_phase == blocks.peak_phase == "forward"
    two, four = (predict(cfg.model_copy(update={"compile_scope": "model", "batch_size": b}), gpu, 1).mem
                 for b in (1, 2))  # 2,048 tokens: two chunks, one group; 4,096: four chunks, two groups
    fp32_residual = 2 * 2048 * w.spec.hidden_size
    # the head's accumulator is allocated at the first group's end: at the forward's peak only where a second follows
    assert four.item("loss chunk") - two.item("loss chunk") == pytest.approx(fp32_residual + 4 * head)


def test_cuda_graphs_leave_the_host_its_bookkeeping_only():
    """Replayed as CUDA graphs (cuda_graphs auto, one GPU), the whole graph's host time per block drops from the
    launches' to the replays' bookkeeping: a host-bound step speeds up, a GPU-bound one hardly; the pool costs
    some memory."""
    from tunebench.plan.calibration import CAL

    CUDA_GRAPH_POOL_SLACK = CAL.cuda_graph_pool_slack
    CUDA_GRAPH_HOST_PER_BLOCK, WHOLE_GRAPH_HOST_PER_BLOCK = CAL.cuda_graph_host_per_block_s, CAL.whole_graph_host_per_block_s

    gpu = match("H100")
    for shape, faster in (({"seq_len": 1024, "batch_size": 1, "grad_accum": 4}, 1.5), ({"seq_len": 2048,
                                                                                       "batch_size": 8}, 1.0)):
        cfg = RunConfig(model="tinygpt-124m", **shape)
        replayed, launched = predict(cfg, gpu, 1), predict(cfg.model_copy(update={"cuda_graphs": False}), gpu, 1)
        assert replayed.cfg.cuda_graphs is True and launched.cfg.cuda_graphs is False
        assert replayed.time.parts["host"] / launched.time.parts["host"] == pytest.approx(
            CUDA_GRAPH_HOST_PER_BLOCK / WHOLE_GRAPH_HOST_PER_BLOCK)
        assert faster <= replayed.tokens_per_s / launched.tokens_per_s < faster + 2
        # the pool's slack, and where the batch is small the backward's gradients recorded beside the activations
        extra = replayed.mem.peak_allocated - launched.mem.peak_allocated
        assert CUDA_GRAPH_POOL_SLACK - 1 <= extra <= CUDA_GRAPH_POOL_SLACK + replayed.mem.item("gradients")


def test_cuda_graphs_pool_holds_the_backward_beside_the_saved_activations():
    """Replayed as CUDA graphs, runs count the pool's segments in full, and the backward's recording reuses little
    of what the forward's saved activations held (benchmarks/probes/peak_parts.py, Llama-3.2-1B bf16 s1024 b4: 25.82 GiB
    on an H100 and an H200, its pool 12.0 GiB of segments with 9.0 alive at most): each phase is what lives outside
    the pool, and the pool; the eager step's gradients take the activations' place instead."""
    gpu = match("H100")
    cfg = RunConfig(model="llama-3.2-1b", seq_len=1024, batch_size=4, precision="bf16", compile=True,
                    compile_scope="model")
    replayed, launched = (predict(cfg.model_copy(update={"cuda_graphs": g}), gpu, 1).mem for g in (True, False))
    grads = replayed.item("gradients")
    assert len(set(replayed.phases.values())) == 1
    assert replayed.peak_allocated - launched.peak_allocated > 0.4 * grads
    assert replayed.peak_allocated == pytest.approx(25.82 * 2**30, rel=0.05)
    accum = predict(cfg.model_copy(update={"cuda_graphs": True, "grad_accum": 2}), gpu, 1).mem
    # accumulation's gradients live outside the pool (added into) while each micro-batch's are made in it
    assert accum.peak_allocated - replayed.peak_allocated == pytest.approx(grads)
    assert accum.peak_allocated == pytest.approx(30.37 * 2**30, rel=0.05)


def test_a_tied_embeddings_second_gradient_ends_the_backward():
    """A tied embedding's gradient arrives twice: the head's waits in autograd's buffer while the lookup's backward
    makes a dense one beside every other gradient (benchmarks/probes/memory_probe.py --peak-live, Llama-3.2-1B full,
    checkpointed, s2048 b4: 19.59 GiB on an H100, two 1,002 MiB tensors beside the blocks' gradients). Untied, or
    with a frozen embedding, the backward ends at the step's states and gradients."""
    gpu = match("H100")
    cfg = RunConfig(model="llama-3.2-1b", method="full", seq_len=2048, batch_size=4, grad_ckpt=True)
    w = workload(cfg, 1)
    assert w.counts.tied and not w.cuda_graphs
    mem = predict(cfg, gpu, 1).mem
    states = sum(i.bytes for i in mem.items if i.name in ("weights", "optimizer states", "gradients"))
    # the end of backward holds both gradients of the embedding; the first block's backward, just before it, is a
    # moment of its own, and the backward's peak is the larger of the two
    assert tied_gradient(w) == 4 * w.counts.embeddings
    assert mem.phases["backward"] >= states + tied_gradient(w)
    assert mem.peak_phase == "backward"
    assert mem.peak_allocated == pytest.approx(19.59 * 2**30, rel=0.02)
    untied = cfg.model_copy(update={"model": "llama-3.1-8b", "seq_len": 512, "batch_size": 1})
    frozen = cfg.model_copy(update={"method": "lora"})
    pooled = cfg.model_copy(update={"grad_ckpt": False, "compile": True, "compile_scope": "model", "cuda_graphs": True})
    for other in (untied, frozen, pooled):  # none has a second dense gradient outside a pool
        assert tied_gradient(workload(other, 1)) == 0


@pytest.mark.parametrize("batch,measured_gib", [(2, 32.66), (8, 37.45)])
def test_a_moe_full_fine_tune_peaks_in_its_first_blocks_backward(tmp_path, batch, measured_gib):
    """Qwen3-30B-A3B's shape cut to 6 blocks, full, bf16-pure, checkpointed, s4096 on one H200
    (benchmarks/probes/memory_probe.py --peak-live; benchmarks/data/2026-11-28-h200-moe-full-memory-probe.jsonl):
    the peak came in the last block's backward to run, the first block's, beside the other five blocks' expert
    gradients, with four tensors of k x h rows alive (its rebuilt gathered tokens and outputs, their gradients).
    The planner had put the peak at the end of backward, the same at every batch (32.49 GiB)."""
    from tunebench.models.presets import PRESETS

    preset = PRESETS["qwen3-30b-a3b"]
    shape = {k: v for k, v in preset.shape.items() if k != "model_type"} | {"num_hidden_layers": 6}
    preset.hf_config().__class__(**shape).save_pretrained(tmp_path)
    cfg = RunConfig(model=str(tmp_path), method="full", precision="bf16-pure", grad_ckpt=True, seq_len=4096,
                    batch_size=batch)
    mem = predict(cfg, match("H200"), 1).mem
    assert mem.peak_phase == "backward"
    assert mem.peak_allocated == pytest.approx(measured_gib * 2**30, rel=0.02)


def test_zero2_buckets_and_step_copies_are_what_deepspeed_allocates():
    """DeepSpeed ZeRO-2 (benchmarks/probes/memory_probe.py --peak-live, one H100, Llama-3.2-1B full s1024 b4): its
    two reduce buckets of 5e8 bf16 elements are allocated at the first gradient it is handed, beside the loss's kept
    fp32 head gradient; the step holds the bf16 gradient partition, its flattened copy and that copy in fp32
    (25.32 GiB: 16.11 of weights and states, 9.21 of the three). On two GPUs each is a partition's."""
    gpu = match("H100")
    cfg = RunConfig(model="llama-3.2-1b", method="full", strategy="zero2", seq_len=1024, batch_size=4, precision="bf16")
    one, two = (predict(cfg, gpu, n).mem for n in (1, 2))
    n = workload(cfg, 1).counts.total
    states = sum(one.item(k) for k in ("weights", "master weights", "optimizer states"))
    assert one.phases["step"] - states == pytest.approx(8 * n)  # 2 + 2 + 4 bytes a parameter
    assert one.phases["step"] == pytest.approx(25.32 * 2**30, rel=0.01)
    assert one.phases["backward"] == pytest.approx(23.28 * 2**30, rel=0.01)
    assert two.phases["step"] - sum(two.item(k) for k in ("weights", "master weights", "optimizer states")) \
        == pytest.approx(4 * n)
    w = workload(cfg, 1)  # beyond the saved activations: the buckets, the kept head gradient, a block's temporaries
    beyond = one.phases["backward"] - states - one.item("activations")
    assert beyond == pytest.approx(2 * 2 * 5e8 + 4 * w.counts.head, rel=0.1)


def test_cuda_graphs_runs_keep_little_beyond_their_counted_pools():
    """Replayed as CUDA graphs, a run's peak counts the pools' segments in full: reserved exceeded allocated by at
    most 0.70 GiB on every such GPU run since they are counted so, where an eager run's reserve is a share of its
    peak. Llama-3.2-3B full s1024 b8 ran at 70.76 GiB allocated on an H100
    (tests/data/planner/2026-11-28-h100-planner-edge-oos.jsonl): never "does not fit"."""
    gpu = match("H100")
    cfg = RunConfig(model="llama-3.2-3b", method="full", seq_len=1024, batch_size=8)
    p = predict(cfg, gpu, 1)
    assert p.workload.cuda_graphs and p.mem.reserve_bytes == CAL.graph_reserve_bytes
    assert p.verdict != "does not fit"
    eager = predict(cfg.model_copy(update={"cuda_graphs": False}), gpu, 1).mem
    assert eager.reserve_bytes == pytest.approx(STRATEGIES["single"].planner.reserve * eager.peak_allocated)
    for path in DATA.glob("*.jsonl"):
        for raw in map(json.loads, path.read_text().splitlines()):
            m = raw.get("metrics") or {}
            if (raw.get("kind") == "train" and m.get("cuda_graphs") and m.get("peak_mem_reserved_bytes")
                    and raw["created_at"] >= GRAPH_POOLS_COUNTED_SINCE):
                assert m["peak_mem_reserved_bytes"] - m["peak_mem_allocated_bytes"] <= CAL.graph_reserve_bytes


def test_a_train_job_that_evaluates_has_an_evaluation_phase(tb, tmp_path):
    """A train job's evaluation runs eagerly between steps beside the CUDA graphs' pool and the kept gradients:
    its own phase, the job's peak (benchmarks/probes/peak_parts.py on an H100: +0.70 GiB for Llama-3.2-1B s1024 b4, +0.24
    for GPT-2 small, above the step's states and pool), with evaluation's chunks the engine's."""
    from tunebench.engine.loss import EVAL_CHUNK_FRACTION

    assert plan_memory.EVAL_CHUNK_FRACTION == EVAL_CHUNK_FRACTION
    (tmp_path / "corpus.txt").write_text("hello\n")
    job = ("data: corpus.txt\nseq_len: 1024\nbatch_size: 4\ngrad_accum: 2\nprecision: bf16\ncompile: true\n"
           "compile_scope: model\n")
    for model, rise in (("llama-3.2-1b", 0.70), ("tinygpt-124m", 0.24)):
        (tmp_path / "plain.yaml").write_text(f"model: {model}\n{job}")
        (tmp_path / "eval.yaml").write_text(f"model: {model}\n{job}eval_fraction: 0.02\n")
        plain, evaluating = (json.loads(tb("plan", str(tmp_path / f), "--gpu", "H100", "--json", "--no-store")[1])
                             for f in ("plain.yaml", "eval.yaml"))
        phases = evaluating["breakdown"]["phases"]
        assert "evaluation" not in plain["breakdown"]["phases"] and evaluating["breakdown"]["peak_phase"] == "evaluation"
        assert phases["evaluation"] - phases["step"] == pytest.approx(rise * 2**30, rel=0.3), model
        assert plain["breakdown"]["phases"]["step"] == phases["step"]
        assert "evaluation" in [i["name"] for i in evaluating["breakdown"]["memory"]]
    code, out, err = tb("plan", str(tmp_path / "eval.yaml"), "--gpu", "H100", "--no-store")
    assert code == 0 and "in the evaluation" in out, err
    # a LoRA base computes in bf16 already: no cast of its head
    cfg = RunConfig(model="llama-3.2-1b", seq_len=1024, batch_size=4, precision="bf16")
    full, lora = (predict(cfg.model_copy(update={"method": m}), match("H100"), 1, evaluates=True).mem
                  for m in ("full", "lora"))
    head = workload(cfg, 1).counts.head
    assert full.item("evaluation") - lora.item("evaluation") == pytest.approx(2 * head)


def test_ddp_cuts_the_whole_graph_into_calls_of_their_own():
    """Under DDP dynamo cuts the whole graph where buckets end (measured at one rank as at two: not communication):
    its host time per block grows by its row's whole_graph_host_per_block_s; per block compiled, DDP costs no host
    time."""
    from tunebench.plan.calibration import CAL
    from tunebench.strategies import STRATEGIES

    DDP_WHOLE_GRAPH_HOST_PER_BLOCK = STRATEGIES["ddp"].planner.whole_graph_host_per_block_s
    WHOLE_GRAPH_HOST_PER_BLOCK = CAL.whole_graph_host_per_block_s

    gpu = match("H200")
    whole = RunConfig(model="tinygpt-124m", seq_len=512, batch_size=4, compile=True, cuda_graphs=False)
    alone, ddp = (predict(whole.model_copy(update={"strategy": s}), gpu, 1).time.parts["host"] for s in ("single", "ddp"))
    assert ddp / alone == pytest.approx((WHOLE_GRAPH_HOST_PER_BLOCK + DDP_WHOLE_GRAPH_HOST_PER_BLOCK)
                                        / WHOLE_GRAPH_HOST_PER_BLOCK)
    blocks = whole.model_copy(update={"compile_scope": "blocks"})
    alone, ddp = (predict(blocks.model_copy(update={"strategy": s}), gpu, 1).time.parts["host"] for s in ("single", "ddp"))
    assert ddp == pytest.approx(alone)


def test_targets_by_commas_and_a_target_no_layer_has(tb):
    """q_proj,v_proj names two targets, as the repeated flag does, in plan and in a run's config; a name no linear
    layer has is refused by plan as by run, not planned without its adapters."""
    plan = ["plan", "--model", "tiny-llama", "--method", "lora", "--gpu", "H100-80GB", "--json"]
    commas = json.loads(tb(*plan, "--lora-targets", "q_proj,v_proj")[1])
    repeated = json.loads(tb(*plan, "--lora-targets", "q_proj", "--lora-targets", "v_proj")[1])
    one = json.loads(tb(*plan, "--lora-targets", "q_proj")[1])
    assert commas == repeated and commas["breakdown"]["memory"] != one["breakdown"]["memory"]
    assert RunConfig(lora_targets="q_proj,v_proj").lora_targets == ["q_proj", "v_proj"]
    code, out, err = tb(*plan, "--lora-targets", "q_proj,qq_proj")
    assert code == 2 and out == "" and "invalid lora_targets=qq_proj: no linear layer has this name" in err
    # a mixture of experts' expert weights are 3-D parameters, named by `experts`, not layers
    code, _, err = tb("plan", "--model", "mixtral-8x7b", "--method", "lora", "--lora-targets", "down_proj", "--gpu",
                      "H100-80GB")
    assert code == 2 and "invalid lora_targets=down_proj" in err and "(or all-linear, experts)" in err
