"""Every model family trains as its unmodified transformers model does, and is planned from its config.

Tiny local directories of each family's architecture class (random weights saved as safetensors): tunebench's
losses, step by step, against a plain loop over the same model in transformers' eager attention (Gemma's soft-caps
and sliding windows, Qwen3's and Gemma 3's q/k norms, Phi-3's fused projections, tied embeddings, mixtures of
experts' routers and experts), with LoRA against the same model under peft. The presets have the public models'
shapes; the planner counts what the built models hold and keeps.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import bpe_tokenizer
from tunebench import RunConfig, run
from tunebench.engine.data import SyntheticTokens
from tunebench.models import PRESETS, load_meta_model, resolve_model
from tunebench.models.count import counts

# (parameters, parameters one token multiplies by in its blocks and head) of the public models
PUBLIC = {
    "llama-3.1-8b": (8_030_261_248, None), "llama-3.2-3b": (3_212_749_824, None),
    "qwen2.5-7b": (7_615_616_512, None), "qwen2.5-14b": (14_770_033_664, None),
    "qwen2.5-32b": (32_763_876_352, None), "qwen2.5-72b": (72_706_203_648, None),
    "qwen3-8b": (8_190_735_360, None), "qwen3-14b": (14_768_307_200, None), "qwen3-32b": (32_762_123_264, None),
    "gemma-2-9b": (9_241_705_984, None), "gemma-2-27b": (27_227_128_320, None), "gemma-3-12b": (11_766_034_176, None),
    "phi-3.5-mini": (3_821_079_552, None), "phi-4": (14_659_507_200, None), "mistral-nemo-12b": (12_247_782_400, None),
    # Mixtral: 12.9 B active with its embeddings; Qwen3-30B-A3B: 3.3 B
    "mixtral-8x7b": (46_702_792_704, 12_748_587_008), "qwen3-30b-a3b": (30_532_122_624, 3_041_656_832),
}
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# each family's own config class and the details that make it differ from Llama; windows shorter than the rows
FAMILIES = {
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", dict(head_dim=24)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                        layer_types=["sliding_attention", "full_attention"])),
    "phi3": ("Phi3Config", dict(num_key_value_heads=4)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "mixtral-aux": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                                          router_aux_loss_coef=0.1)),
    "qwen3moe": ("Qwen3MoeConfig", dict(moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                                        norm_topk_prob=True, head_dim=16)),
}
STEPS, LR, SEQ, BATCH = 4, 2e-3, 32, 2


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A local model directory per family (config.json and safetensors)."""
    import transformers

    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, (cls, extra) in FAMILIES.items():
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**TINY | extra))
        model.save_pretrained(root / name)
        out[name] = root / name
    return out


def _reference(path, lora: dict | None = None, freeze: str | None = None, lr: float = LR) -> list[float]:
    """Losses of a plain loop: the model in transformers' eager attention, its own logits (soft-capped where the
    model caps them) and its own auxiliary loss, AdamW, clipping at 1, on the batches `run` draws. `lora`: under
    peft with these settings, its adapters drawn as tunebench draws them. `freeze`: parameters whose name holds
    this stay frozen (to show that a test would see them not train). `lr` 0: the losses of the weights as they
    start."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        from tunebench.models.shards import init_adapters

        model = get_peft_model(model, LoraConfig(**lora))
        init_adapters(model, 0, torch.device("cpu"))
    if freeze:
        for n, p in model.named_parameters():
            p.requires_grad_(p.requires_grad and freeze not in n)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    data = SyntheticTokens(model.config.vocab_size, BATCH, SEQ, torch.device("cpu"), 0)
    aux = getattr(model.config, "output_router_logits", False)
    losses = []
    for _ in range(STEPS):
        b = data.next()
        out = model(input_ids=b.ids, use_cache=False, **({"output_router_logits": True} if aux else {}))
        loss = F.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), b.labels.reshape(-1))
        if aux:
            loss = loss + model.config.router_aux_loss_coef * out.aux_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _ours(path, **kw) -> list[float]:
    cfg = RunConfig(model=str(path), steps=STEPS, warmup=1, seq_len=SEQ, batch_size=BATCH, lr=LR, device="cpu",
                    precision="fp32", telemetry=False, **kw)
    rec = run(cfg)
    assert rec.status == "ok", rec.error
    return rec.metrics.losses


@pytest.mark.parametrize("family", list(FAMILIES))
def test_full_fine_tuning_equals_transformers(dirs, family):
    """Every weight trains as in the family's own model: equal losses at every step (fp32, the CPU)."""
    ours, ref = _ours(dirs[family], method="full"), _reference(dirs[family])
    assert abs(ref[-1] - _reference(dirs[family], lr=0.0)[-1]) > 1e-3  # it trains
    assert ours == pytest.approx(ref, abs=2e-5)


@pytest.mark.parametrize("family,what", [("mixtral", "mlp.gate"), ("mixtral", "experts"),
                                         ("qwen3moe", "mlp.gate")])
def test_the_comparison_sees_a_router_or_experts_that_would_not_train(dirs, family, what):
    """A model whose router (or experts) stayed frozen would be told apart from the reference above."""
    frozen = _reference(dirs[family], freeze=what)
    assert max(abs(a - b) for a, b in zip(frozen, _reference(dirs[family]))) > 1e-4


LORA = dict(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", bias="none", task_type="CAUSAL_LM")


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "phi3", "qwen3moe"])
def test_lora_equals_peft_over_transformers(dirs, family):
    """LoRA on every linear layer (on a mixture of experts peft's all-linear also adapts the routers and experts) as
    peft computes it over the family's own model, adapters drawn alike."""
    import warnings

    ours = _ours(dirs[family], method="lora", lora_rank=8, lora_alpha=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _reference(dirs[family], lora=LORA)
        assert abs(ref[-1] - _reference(dirs[family], lora=LORA, lr=0.0)[-1]) > 1e-3
    assert ours == pytest.approx(ref, abs=2e-5)


def test_lora_on_the_experts_alone_and_on_attention(dirs):
    """`experts` adapts both expert weights (at the rank asked); attention names stay linear layers; the planner
    counts what peft made."""
    from tunebench.plan.workload import workload

    for targets in (["experts"], ["q_proj", "v_proj", "experts"], ["all-linear"]):
        cfg = RunConfig(model=str(dirs["qwen3moe"]), method="lora", lora_rank=4, lora_targets=targets, steps=2,
                        warmup=1, seq_len=16, device="cpu", telemetry=False)
        rec = run(cfg)
        assert rec.status == "ok", rec.error
        assert rec.metrics.params_trainable == workload(cfg, 1).trainable


def test_qlora_of_a_mixture_of_experts_quantizes_its_experts(dirs):
    """QLoRA: attention's linears and the 3-D experts in 4 bits (bitsandbytes' NF4), adapters on attention and the
    routers, and on the 4-bit experts where `experts` is named; the planner's count; it trains."""
    from tunebench.methods import apply_method
    from tunebench.models import build_model
    from tunebench.plan.workload import workload

    path = str(dirs["qwen3moe"])
    for targets in (["all-linear"], ["q_proj", "experts"], ["all-linear", "experts"]):
        cfg = RunConfig(model=path, method="qlora", steps=3, warmup=1, seq_len=16, device="cpu", telemetry=False,
                        lora_targets=targets)
        model, _ = build_model(resolve_model(path), cfg, torch.device("cpu"))
        experts = [m for m in model.modules() if type(m).__name__ == "Experts4bit"]
        assert len(experts) == 2 and all(m.gate_up_proj.dtype == torch.uint8 for m in experts)
        peft_model = apply_method(model, cfg)
        trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
        assert sum(".experts." in n for n in trainable) == (8 if "experts" in targets else 0), targets
        assert sum(p.numel() for p in peft_model.parameters() if p.requires_grad) == workload(cfg, 1).trainable
    rec = run(cfg)
    assert rec.status == "ok" and all(math.isfinite(x) for x in rec.metrics.losses), rec.error


@pytest.mark.parametrize("update,message", [
    ({"strategy": "fsdp", "nproc_per_node": 1}, "runs under single or ddp"),
])
def test_qlora_of_experts_refusals(tb, dirs, update, message):
    args = ["run", "--model", str(dirs["mixtral"]), "--method", "qlora", "--device", "cpu", "--seq-len", "32", "--no-store"]
    for k, v in update.items():
        for x in v if isinstance(v, list) else [v]:
            args += [f"--{k.replace('_', '-')}", str(x)]
    code, _, err = tb(*args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_4bit_experts_compute_what_their_dequantized_weights_do():
    """models.experts4bit against transformers' own experts holding the dequantized weights: values and the input's
    gradient, in bf16 (the grouped GEMMs and the routing are the same ops)."""
    import copy

    import bitsandbytes.functional as bf
    import transformers

    from tunebench.models.experts4bit import WEIGHTS, quantize_experts

    cfg = transformers.Qwen3MoeConfig(**TINY | FAMILIES["qwen3moe"][1])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    quantized = copy.deepcopy(model)
    assert quantize_experts(quantized, torch.bfloat16, "nf4", True) == 2
    ref, ours = model.model.layers[0].mlp.experts, quantized.model.layers[0].mlp.experts
    with torch.no_grad():
        for w in WEIGHTS:
            getattr(ref, w).copy_(bf.dequantize_4bit(getattr(ours, w).data, getattr(ours, w).quant_state))
            getattr(ref, w).requires_grad_(False)
    x = torch.randn(24, 64, dtype=torch.bfloat16, requires_grad=True)
    index, weights = torch.randint(0, 8, (24, 2)), torch.rand(24, 2, dtype=torch.bfloat16)
    expected, got = ref(x, index, weights), ours(x, index, weights)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    g = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(expected, x, g)[0],
                               atol=0, rtol=0)


def test_experts_compute_in_the_autocast_dtype(dirs, monkeypatch):
    """fp32 master weights under bf16 autocast (full fine-tuning, single or ddp): the experts' grouped GEMMs get bf16
    weights and tokens (torch's grouped GEMM takes no autocast; transformers' would run them in fp32), and the fp32
    weights their gradients."""
    import transformers.integrations.moe as moe

    from tunebench.models import build_model

    path = str(dirs["mixtral"])
    model, _ = build_model(resolve_model(path), RunConfig(model=path, precision="bf16"), torch.device("cpu"))
    seen = []
    grouped = moe._grouped_mm
    monkeypatch.setattr(moe, "_grouped_mm", lambda x, w, offs: seen.append((x.dtype, w.dtype)) or grouped(x, w, offs))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=torch.randint(0, 256, (2, 16))).logits.float().sum().backward()
    experts = model.model.layers[0].mlp.experts
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}
    assert experts.gate_up_proj.dtype == experts.gate_up_proj.grad.dtype == torch.float32
    assert experts.gate_up_proj.grad.abs().sum() > 0


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_loss_soft_caps_as_the_model_head_does(softcap, masked):
    """The fused loss with Gemma 2's final soft-capping: the loss and the gradients of the hidden states and the
    head equal cross-entropy over c * tanh(z / c) (fp32); evaluation's loss-only path too."""
    from tunebench.engine.loss import IGNORE, causal_lm_loss

    torch.manual_seed(0)
    h = (torch.randn(300, 32) * 4).requires_grad_()
    head = torch.nn.Linear(32, 100, bias=False)
    y = torch.randint(0, 100, (300,))
    if masked:
        y[::3] = IGNORE
    z = head(h)
    z = z if softcap is None else softcap * torch.tanh(z / softcap)
    ref = F.cross_entropy(z, y, ignore_index=IGNORE)
    ref_h, ref_w = torch.autograd.grad(ref, (h, head.weight))
    loss = causal_lm_loss(h, head, y, 100, masked=masked, softcap=softcap)
    got_h, got_w = torch.autograd.grad(loss, (h, head.weight))
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(got_h, ref_h)
    torch.testing.assert_close(got_w, ref_w)
    with torch.no_grad():
        torch.testing.assert_close(causal_lm_loss(h, head, y, 100, masked=masked, softcap=softcap), ref)


def test_soft_capped_attention_runs_where_it_is_exact():
    """SDPA cannot soft-cap attention logits: Gemma 2 runs FlexAttention on GPUs (its cap a score modification) and
    the eager attention on the CPU; a model without the cap keeps tunebench's SDPA. The FlexAttention path is checked
    on a GPU (benchmarks/results/families.md)."""
    import transformers

    from tunebench.models.attention import NAME
    from tunebench.models.build import attn_implementation

    capped = transformers.Gemma2Config()
    assert attn_implementation("sdpa", capped, "cuda") == "flex_attention"
    assert attn_implementation("sdpa", capped, "cpu") == "eager"
    assert attn_implementation("eager", capped, "cuda") == "eager"
    assert attn_implementation("sdpa", transformers.Gemma2Config(attn_logit_softcapping=None), "cuda") == NAME
    assert attn_implementation("sdpa", transformers.Qwen3Config(), "cuda") == NAME


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_presets_have_the_public_shapes(name):
    """Built on meta, each preset has the public model's parameters; the counts (no torch) agree, and a mixture of
    experts' active parameters are its routers and k experts."""
    spec = resolve_model(name)
    model = load_meta_model(spec, RunConfig(model=name))
    total, active = PUBLIC[name]
    assert sum(p.numel() for p in model.parameters()) == total == counts(spec).total
    assert len(list(model.parameters())) == counts(spec).tensors  # what DeepSpeed's per-tensor hooks visit
    assert counts(spec).matmul == (active or counts(spec).block_linears + counts(spec).head)
    assert type(model).__name__ == {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                    "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                                    "phi3": "Phi3ForCausalLM", "mixtral": "MixtralForCausalLM",
                                    "qwen3_moe": "Qwen3MoeForCausalLM", "llama": "LlamaForCausalLM",
                                    "mistral": "MistralForCausalLM"}[PRESETS[name].family]


def test_every_preset_is_planned_for_an_h100(tb):
    for name in PRESETS:
        for method in ("lora", "qlora"):
            code, out, err = tb("plan", "--model", name, "--method", method, "--seq-len", "1024", "--batch-size", "2",
                                "--grad-ckpt", "--gpu", "H100-80GB", "--json")
            assert code == 0, err
            p = json.loads(out)
            assert p["tokens_per_s"] > 0 and p["peak_mem_allocated_bytes"] > 0 and p["verdict"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_local_directory_is_planned_from_its_config(tb, dirs, family):
    """Planned from config.json (no preset name): its counts are the built model's, and `plan` answers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(dirs[family])
    assert counts(resolve_model(str(dirs[family]))).total == sum(p.numel() for p in model.parameters())
    code, out, err = tb("plan", "--model", str(dirs[family]), "--method", "qlora", "--gpu", "H100-80GB", "--json")
    assert code == 0 and json.loads(out)["verdict"] == "fits", err


ACTIVATION_FAMILIES = {
    "qwen3": {"model_type": "qwen3", "head_dim": 32},
    "gemma2": {"model_type": "gemma2", "head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 4096,
               "attn_logit_softcapping": None},  # the GPU's FlexAttention keeps what SDPA's flash kernel keeps
    "gemma3": {"model_type": "gemma3_text", "head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 4096},
    "phi3": {"model_type": "phi3", "num_key_value_heads": 8},
    "mixtral": {"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 256},
    "qwen3moe": {"model_type": "qwen3_moe", "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
                 "head_dim": 32, "norm_topk_prob": True},
}


@pytest.mark.parametrize("mode", ["plain", "lora"])
@pytest.mark.parametrize("family", list(ACTIVATION_FAMILIES))
def test_block_activations_of_each_family_match_what_autograd_saves(tmp_path, family, mode):
    """What a block keeps for backward, per token, as the planner counts it for each family: bf16 weights without
    autocast (bf16-pure, DeepSpeed), and LoRA on every linear layer under autocast over a bf16 base (on a mixture of
    experts also on its experts: peft's rebuilt expert weights, kept per block, counted at these 512 tokens)."""
    from test_plan import _saved_per_token
    from tunebench.methods import apply_method
    from tunebench.models.build import Weights, build
    from tunebench.plan.activations import activations
    from tunebench.plan.workload import workload

    (tmp_path / "config.json").write_text(json.dumps(
        dict(hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
             vocab_size=512, max_position_embeddings=1024, pad_token_id=0) | ACTIVATION_FAMILIES[family]))
    path = str(tmp_path)
    lora = mode == "lora"
    cfg = RunConfig(model=path, precision="bf16" if lora else "bf16-pure", method="lora" if lora else "full",
                    seq_len=256, batch_size=2, compile=False)
    model, _ = build(resolve_model(path), Weights(dtype=torch.bfloat16), torch.device("cpu"))
    if lora:
        model = apply_method(model, cfg)
    measured = _saved_per_token(model.train(), 256, autocast=lora)
    act = activations(workload(cfg, 1))
    assert act.per_layer + act.per_block / 512 == pytest.approx(measured, rel=0.04)


GEMMA_TURNS = ("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' "
               "else m['role']) + '\\n' + m['content'] + '<end_of_turn>\\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A BPE tokenizer with a Gemma-style chat template, and chat data (a question, its answer)."""
    import random

    root = tmp_path_factory.mktemp("chat")
    words = "zero one two three four five six seven eight nine ten".split()
    rng = random.Random(0)
    texts = [" ".join(words[a:a + rng.randrange(3, 6)]) for a in (rng.randrange(0, 6) for _ in range(200))]
    fast = bpe_tokenizer(texts, ["<pad>", "<bos>", "<eos>", "<unk>", "<start_of_turn>", "<end_of_turn>"], 200,
                         bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = GEMMA_TURNS
    fast.save_pretrained(root / "tokenizer")
    (root / "chat.jsonl").write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": " ".join(t.split()[:2])},
        {"role": "assistant", "content": " ".join(t.split()[2:])}]}) + "\n" for t in texts))
    return root


@pytest.mark.parametrize("family,method", [("gemma2", "lora"), ("qwen3moe", "qlora")])
def test_a_family_trains_on_chat_merges_and_serves(tb, dirs, chat, tmp_path, monkeypatch, family, method):
    """A job on chat data under its template: it trains, merges and the merged model generates with its KV cache;
    a QLoRA mixture of experts' merged experts (adapted too) are its 4-bit experts dequantized plus the saved
    adapter's s B[e] A[e]."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    code, stdout, err = tb("train", "--model", str(dirs[family]), "--tokenizer", str(chat / "tokenizer"), "--data",
                           str(chat / "chat.jsonl"), "--method", method, "--seq-len", "32", "--batch-size", "4",
                           "--max-steps", "4", "--warmup", "1", "--merge", "--merge-dtype", "fp32", "--device", "cpu",
                           "--lora-targets", "all-linear,experts" if method == "qlora" else "all-linear",
                           "--lora-rank", "4", "--lora-alpha", "8", "--output-dir", str(out), "--no-store", "--json")
    assert code == 0, err
    job = json.loads(stdout)["metrics"]["job"]
    assert job["data"]["shape"] == "chat" and 0 < job["data"]["trained_tokens"] < job["data"]["tokens"]
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
    tok = AutoTokenizer.from_pretrained(out / "merged")
    prompt = tok.apply_chat_template([{"role": "user", "content": "one two"}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    assert merged.config.use_cache and merged.generate(**prompt, max_new_tokens=3, do_sample=False).shape[1] > 0
    if method == "qlora":
        import bitsandbytes.functional as bf

        from tunebench.models import build_model

        path = str(dirs[family])
        model, _ = build_model(resolve_model(path), RunConfig(model=path, method="qlora", device="cpu"),
                               torch.device("cpu"))
        q = model.model.layers[1].mlp.experts
        state = q.gate_up_proj.quant_state
        state.dtype = torch.float32
        from safetensors.torch import load_file

        base = bf.dequantize_4bit(q.gate_up_proj.data, state)
        adapter = load_file(next(out.rglob("adapter_model.safetensors")))
        a, b = (adapter[f"base_model.model.model.layers.1.mlp.experts.base_layer.lora_{x}.weight"] for x in "AB")
        experts = base.shape[0]
        delta = torch.einsum("ore,eri->eoi", b.reshape(b.shape[0], -1, experts), a.reshape(experts, -1, a.shape[1]))
        assert delta.abs().max() > 0
        torch.testing.assert_close(merged.model.layers[1].mlp.experts.gate_up_proj.data, base + 2 * delta)


@pytest.mark.parametrize("family", ["mixtral", "qwen3moe"])
def test_sharded_builds_read_experts_from_the_published_layout(dirs, family):
    """transformers 5 saves (as models are published) one 2-D weight per expert and projection, Mixtral's under
    `block_sparse_moe`; FSDP2's and ZeRO-3's builds read rows of the fused 3-D weights from them."""
    from transformers import AutoModelForCausalLM

    from tunebench.models.shards import SafetensorsRows

    model = AutoModelForCausalLM.from_pretrained(dirs[family])
    rows = SafetensorsRows(dirs[family])
    for name, p in model.named_parameters():
        if "experts" in name or ".mlp.gate." in name:
            torch.testing.assert_close(rows.rows(name, 1, 3), p.data[1:3], atol=0, rtol=0)


def test_a_mixture_of_experts_trains_alike_under_fsdp(dirs, tmp_path):
    """Qwen3-MoE's full fine-tuning on 2 processes under FSDP2 (gloo), built on meta and read from the published
    layout: the losses of one process with the whole batch."""
    from conftest import cli_subprocess

    def losses(*argv):
        p = cli_subprocess("run", "--model", str(dirs["qwen3moe"]), "--device", "cpu", "--seq-len", "32", "--steps",
                           "3", "--warmup", "1", "--precision", "fp32", "--lr", "5e-3", "--no-store", "--json", *argv,
                           timeout=300)
        rec = json.loads(p.stdout)
        assert rec["status"] == "ok", rec["error"]
        return rec["metrics"]["losses"]

    single = losses("--batch-size", "2")
    assert losses("--strategy", "fsdp", "--nproc-per-node", "2", "--batch-size", "1") == pytest.approx(single, abs=1e-4)


@pytest.mark.parametrize("cls,extra", [
    ("Phi3Config", dict(attention_bias=True, mlp_bias=True)),  # keys a family's modules ignore count for nothing
    ("MixtralConfig", dict(attention_bias=True, num_local_experts=4, num_experts_per_tok=2)),
    ("MistralConfig", dict(mlp_bias=True)),
    ("Qwen2Config", dict(attention_bias=True, tie_word_embeddings=True)),
    ("Qwen3Config", dict(attention_bias=True, mlp_bias=True, head_dim=16)),
    ("LlamaConfig", dict(attention_bias=True, mlp_bias=True)),
    ("Qwen3MoeConfig", dict(moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, head_dim=16,
                            mlp_only_layers=[0], decoder_sparse_step=1)),
    ("Qwen3MoeConfig", dict(moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, head_dim=16,
                            num_hidden_layers=4, decoder_sparse_step=2)),
    ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, tie_word_embeddings=False)),
])
def test_counts_of_configs_users_have(tmp_path, cls, extra):
    """A local directory's config as users have them (keys its family ignores, partly sparse MoEs, untied heads):
    the counts are the built model's."""
    import transformers

    config = getattr(transformers, cls)(**TINY | extra)
    (tmp_path / "config.json").write_text(config.to_json_string())
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.tie_weights()
    unique = {id(p): p for p in model.parameters()}.values()
    built = sum(p.numel() for p in unique)
    assert counts(resolve_model(str(tmp_path))).total == built
    assert counts(resolve_model(str(tmp_path))).tensors == len(unique)


def test_qlora_all_linear_of_a_partly_sparse_moe(tmp_path, tb):
    """Qwen3-MoE with a dense MLP layer: QLoRA's all-linear adapts attention and the routers (peft would turn the
    dense layers' names into the 4-bit experts), as the planner counts; naming them is refused in one line; a MoE
    family whose experts are not tunebench's 4-bit ones is refused for QLoRA, its experts left as transformers has
    them."""
    import transformers

    from tunebench.methods import apply_method
    from tunebench.models import build_model
    from tunebench.plan.workload import workload

    config = transformers.Qwen3MoeConfig(**TINY | dict(moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                                                       head_dim=16, mlp_only_layers=[0]))
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "moe")
    path = str(tmp_path / "moe")
    cfg = RunConfig(model=path, method="qlora", device="cpu")
    model = apply_method(build_model(resolve_model(path), cfg, torch.device("cpu"))[0], cfg)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == workload(cfg, 1).trainable
    code, _, err = tb("run", "--model", path, "--method", "qlora", "--lora-targets", "gate_proj", "--device", "cpu",
                      "--seq-len", "32", "--no-store")
    assert code == 2 and "turns this name into the experts' weights" in err
    (tmp_path / "qwen2moe").mkdir()
    (tmp_path / "qwen2moe" / "config.json").write_text(transformers.Qwen2MoeConfig(**TINY | dict(
        moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=8)).to_json_string())
    code, _, err = tb("run", "--model", str(tmp_path / "qwen2moe"), "--method", "qlora", "--device", "cpu",
                      "--seq-len", "32", "--no-store")
    assert code == 2 and "not among them" in err and len(err.strip().splitlines()) == 1


def test_a_rank_with_no_experts_reads_no_rows(dirs):
    """More FSDP2 ranks than experts: a rank's share of a fused experts weight is empty, read as such."""
    from tunebench.models.shards import SafetensorsRows

    rows = SafetensorsRows(dirs["mixtral"]).rows("model.layers.0.mlp.experts.gate_up_proj", 4, 4)
    assert rows.shape == (0, 2 * TINY["intermediate_size"], TINY["hidden_size"])
