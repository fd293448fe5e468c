"""GGUF export: tiny random models of each family written with export_gguf and read back with gguf's reader.

Every tensor is checked by its llama.cpp name, shape, type and value (the Q/K row order and Gemma's +1 undone here),
the metadata llama.cpp reads, an adapter-only job merged on the way, each refusal's one line, and, where
llama-cpp-python is installed, llama.cpp's logits against transformers' own.
"""

import json
import random

import gguf
import numpy as np
import pytest
import torch

from conftest import bpe_tokenizer
from tunebench.errors import UserError
from tunebench.export import export_gguf

WORDS = "zero one two three four five six seven eight nine ten".split()
TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
SHAPE = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
GEMMA = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=32)
FAMILIES = {  # name: (config class, its extra settings, GGUF architecture)
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                                              "rope_theta": 50000.0}), "llama"),
    "mistral": ("MistralConfig", dict(tie_word_embeddings=False, sliding_window=None), "llama"),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True), "qwen2"),
    "qwen3": ("Qwen3Config", dict(tie_word_embeddings=False, head_dim=32), "qwen3"),
    "gemma": ("GemmaConfig", dict(head_dim=16), "gemma"),
    "gemma2": ("Gemma2Config", GEMMA, "gemma2"),
    "gemma3": ("Gemma3TextConfig", GEMMA, "gemma3"),
}
BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "pre_feedforward_layernorm": "ffn_norm",
         "post_feedforward_layernorm": "post_ffw_norm"}


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    texts = [" ".join(WORDS[rng.randrange(0, 6):][:rng.randrange(3, 6)]) for _ in range(300)]
    fast = bpe_tokenizer(texts, ["<pad>", "<s>", "</s>", "<unk>"], 300, bos_token="<s>", eos_token="</s>",
                         pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = TEMPLATE
    return fast


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer):
    """family -> (its saved folder, the model)."""
    import transformers
    from transformers import AutoModelForCausalLM

    root, out = tmp_path_factory.mktemp("gguf"), {}
    for family, (cls, extra, _) in FAMILIES.items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(getattr(transformers, cls)(**SHAPE, **extra), dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():  # weights large enough to matter, norms away from their 0 or 1
                p.add_(torch.randn_like(p) * 0.15)
        model.save_pretrained(root / family)
        tokenizer.save_pretrained(root / family)
        out[family] = (root / family, model.eval())
    return out


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def _expected(family: str, model) -> dict[str, torch.Tensor]:
    """The GGUF name -> the HF weight it must hold, by the names llama.cpp uses (written out here, not taken from
    gguf's map)."""
    post_attn = "post_attention_norm" if family in ("gemma2", "gemma3") else "ffn_norm"
    sd, out = model.state_dict(), {}
    for name, t in sd.items():
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = t
        elif name == "model.norm.weight":
            out["output_norm.weight"] = t
        elif name == "lm_head.weight":
            if not model.config.tie_word_embeddings:
                out["output.weight"] = t
        else:
            _, _, layer, *rest = name.split(".")
            module, kind = ".".join(rest[:-1]), rest[-1]
            short = post_attn if module == "post_attention_layernorm" else BLOCK[module]
            out[f"blk.{layer}.{short}.{kind}"] = t
    return out


def _undo(family: str, name: str, value: np.ndarray, model) -> np.ndarray:
    """The HF layout of a GGUF tensor: llama's Q/K rows back to rotary halves, Gemma's norms less the 1."""
    cfg = model.config
    if family in ("llama", "mistral") and name.split(".")[-2] in ("attn_q", "attn_k"):
        heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
        return value.reshape(heads, -1, 2, *value.shape[1:]).swapaxes(1, 2).reshape(value.shape)
    if family.startswith("gemma") and name.endswith("norm.weight"):
        return value - 1
    return value


def _values(t) -> np.ndarray:
    """A reader tensor in numpy's (HF's) order, as fp32."""
    shape = tuple(int(n) for n in reversed(t.shape))
    if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    return gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)


def _check_tensors(path, family: str, model, quant) -> None:
    reader = gguf.GGUFReader(path)
    got = {t.name: t for t in reader.tensors}
    expected = _expected(family, model)
    assert set(got) == set(expected)
    for name, want in expected.items():
        t, want = got[name], want.float().numpy()
        assert tuple(int(n) for n in reversed(t.shape)) == want.shape, name
        value = _undo(family, name, _values(t), model)
        if want.ndim == 1:  # norms (and biases) stay f32
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
            np.testing.assert_allclose(value, want, rtol=1e-6, atol=1e-6, err_msg=name)
        elif quant == "f16":
            assert t.tensor_type == gguf.GGMLQuantizationType.F16, name
            np.testing.assert_array_equal(value, want.astype(np.float16).astype(np.float32), err_msg=name)
        elif quant == "bf16":
            assert t.tensor_type == gguf.GGMLQuantizationType.BF16, name
            np.testing.assert_array_equal(value, torch.from_numpy(want).bfloat16().float().numpy(), err_msg=name)
        else:  # one f16 scale per 32 values (its block's largest / 127): half a step, and up to 127 times the
            # scale's own f16 rounding
            assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, name
            step = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True) / 127
            assert (np.abs(value - want).reshape(-1, 32) <= step * (0.5 + 127 * 2.0**-11) + 1e-7).all(), name


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_exports_every_tensor_and_its_metadata(models, tokenizer, family, tmp_path):
    folder, model = models[family]
    lines = []
    res = export_gguf(folder, tmp_path / "m.gguf", progress=lines.append)
    arch = FAMILIES[family][2]
    assert res["arch"] == arch and res["quant"] == "f16" and res["source"] == str(folder)
    assert res["bytes"] == (tmp_path / "m.gguf").stat().st_size and lines[-1].startswith("wrote")
    _check_tensors(tmp_path / "m.gguf", family, model, "f16")
    reader, cfg = gguf.GGUFReader(tmp_path / "m.gguf"), model.config
    assert res["tensors"] == len(reader.tensors)
    assert _field(reader, "general.architecture") == arch
    assert _field(reader, f"{arch}.block_count") == 2
    assert _field(reader, f"{arch}.embedding_length") == 64
    assert _field(reader, f"{arch}.feed_forward_length") == 128
    assert _field(reader, f"{arch}.attention.head_count") == 4
    assert _field(reader, f"{arch}.attention.head_count_kv") == 2
    assert _field(reader, f"{arch}.attention.key_length") == (getattr(cfg, "head_dim", None) or 16)
    assert _field(reader, f"{arch}.context_length") == 256
    assert _field(reader, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(cfg.rms_norm_eps)
    theta = {"llama": 50000.0, "gemma3": 1e6}.get(family, 10000.0)
    assert _field(reader, f"{arch}.rope.freq_base") == pytest.approx(theta)
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "gpt-2"
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == 320 and tokens[:4] == ["<pad>", "<s>", "</s>", "<unk>"] and tokens[319] == "[PAD319]"
    vocab = tokenizer.get_vocab()
    assert all(tokens[i] == t for t, i in vocab.items())
    types = _field(reader, "tokenizer.ggml.token_type")
    assert types[:4] == [gguf.TokenType.CONTROL] * 4 and types[10] == gguf.TokenType.NORMAL
    assert types[319] == gguf.TokenType.UNUSED
    assert len(_field(reader, "tokenizer.ggml.merges")) > 0
    assert [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "padding", "unknown")] == \
           [1, 2, 0, 3]
    assert _field(reader, "tokenizer.chat_template") == TEMPLATE
    if family == "gemma2":
        assert _field(reader, "gemma2.attn_logit_softcapping") == pytest.approx(cfg.attn_logit_softcapping)
        assert _field(reader, "gemma2.final_logit_softcapping") == pytest.approx(cfg.final_logit_softcapping)
    if family.startswith("gemma") and family != "gemma":
        assert _field(reader, f"{arch}.attention.sliding_window") == 32


@pytest.mark.parametrize("quant", ["q8_0", "bf16"])
def test_quantized_exports_stay_within_their_precision(models, quant, tmp_path):
    folder, model = models["qwen3"]
    res = export_gguf(folder, tmp_path / "m.gguf", quant=quant)
    assert res["quant"] == quant
    _check_tensors(tmp_path / "m.gguf", "qwen3", model, quant)
    assert _field(gguf.GGUFReader(tmp_path / "m.gguf"), "general.file_type") == \
           {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "bf16": gguf.LlamaFileType.MOSTLY_BF16}[quant]


def _adapter_job(folder, tokenizer, out):
    """A job's output folder holding only adapter/ (a LoRA on `folder`, not a no-op) and run.json; returns the
    model with the adapter merged."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "down_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    peft.save_pretrained(out / "adapter")
    tokenizer.save_pretrained(out / "adapter")
    (out / "run.json").write_text(json.dumps({"status": "ok"}))
    return peft.merge_and_unload().eval()


def test_an_adapter_only_job_exports_the_merged_model(models, tokenizer, tmp_path):
    folder, base = models["llama"]
    merged = _adapter_job(folder, tokenizer, tmp_path / "out")
    lines = []
    res = export_gguf(tmp_path / "out", progress=lines.append)
    assert res["path"] == str(tmp_path / "out" / "model.gguf") and res["source"] == str(tmp_path / "out" / "adapter")
    assert any("merging" in line for line in lines)
    _check_tensors(res["path"], "llama", merged, "f16")
    q = {t.name: t for t in gguf.GGUFReader(res["path"]).tensors}["blk.0.attn_q.weight"]
    assert not np.allclose(_undo("llama", q.name, _values(q), base),
                           base.state_dict()["model.layers.0.self_attn.q_proj.weight"].numpy(), atol=1e-2)
    assert not list(tmp_path.joinpath("out").glob(".*"))  # nothing left aside


def test_a_job_exports_its_merged_model_first(models, tokenizer, tmp_path):
    import shutil

    folder, _ = models["qwen2"]
    _adapter_job(models["llama"][0], tokenizer, tmp_path / "out")
    shutil.copytree(folder, tmp_path / "out" / "merged")
    res = export_gguf(tmp_path / "out", quant="q8_0")
    assert res["source"] == str(tmp_path / "out" / "merged") and res["arch"] == "qwen2"


def test_the_default_path_is_beside_a_model_folder_and_never_replaced(models, tmp_path):
    folder, _ = models["gemma"]
    res = export_gguf(folder, quant="bf16")
    assert res["path"] == str(folder.parent / "gemma-bf16.gguf")
    with pytest.raises(UserError, match="the file exists; give another path, or overwrite it"):
        export_gguf(folder, quant="bf16")
    (tmp_path / "mine.gguf").write_text("a user's file")
    with pytest.raises(UserError, match="exists"):
        export_gguf(folder, tmp_path / "mine.gguf")
    assert (tmp_path / "mine.gguf").read_text() == "a user's file"
    assert export_gguf(folder, tmp_path / "mine.gguf", overwrite=True)["tensors"] > 0


def _one_line(call, needle: str) -> str:
    with pytest.raises(UserError) as err:
        call()
    msg = str(err.value)
    assert needle in msg and "\n" not in msg, msg
    return msg


def test_refusals_are_one_line(models, tokenizer, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=4)).save_pretrained(tmp_path / "gpt2")
    msg = _one_line(lambda: export_gguf(tmp_path / "gpt2"), "cannot export GPT2LMHeadModel to GGUF")
    assert "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg
    assert not (tmp_path / "gpt2-f16.gguf").exists()

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((models["llama"][0] / "config.json").read_text())
    _one_line(lambda: export_gguf(tmp_path / "empty"), "holds no model.safetensors")
    _one_line(lambda: export_gguf(tmp_path / "nowhere"), "not a folder")
    _one_line(lambda: export_gguf(tmp_path), "holds no config.json or adapter_config.json")
    _one_line(lambda: export_gguf(models["llama"][0], quant="q4_k"), "invalid quant=q4_k")

    _adapter_job(models["llama"][0], tokenizer, tmp_path / "job")
    cfg = tmp_path / "job" / "adapter" / "adapter_config.json"
    cfg.write_text(json.dumps(json.loads(cfg.read_text()) | {"base_model_name_or_path": "tiny-llama"}))
    _one_line(lambda: export_gguf(tmp_path / "job"), "train with --merge")
    assert not list((tmp_path / "job").glob("*.gguf")) and not list((tmp_path / "job").glob(".*"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_llama_cpp_computes_what_transformers_does(models, tokenizer, family, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    folder, model = models[family]
    path = export_gguf(folder, tmp_path / "m.gguf")["path"]
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, verbose=False, logits_all=True)
    text = "one two three four five six"
    ids = tokenizer.encode(text)
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids
    llm.eval(ids)
    got = np.asarray(llm.scores[:len(ids)])
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    llm.close()
    assert (got.argmax(-1) == want.argmax(-1)).all()
    np.testing.assert_allclose(got, want, atol=0.005 * np.abs(want).max())


def _spm_tokenizer():
    """A SentencePiece-style BPE as Llama 2's and Gemma's tokenizer.json are: spaces as "▁", a byte token for
    each byte a word's pieces do not cover."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    rng = random.Random(0)
    texts = [" ".join(WORDS[rng.randrange(0, 6):][:rng.randrange(3, 6)]) for _ in range(300)]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=[
        "<pad>", "<s>", "</s>", "<unk>", *byte_tokens]))
    spec = json.loads(tok.to_str())  # the byte tokens are the vocabulary's own, as in Llama 2's, not added ones
    spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] not in byte_tokens]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


def test_a_sentencepiece_style_tokenizer_goes_in_as_llamas(models, tmp_path):
    import shutil

    fast = _spm_tokenizer()
    shutil.copytree(models["gemma"][0], tmp_path / "gemma")
    (tmp_path / "gemma" / "tokenizer.json").unlink()
    fast.save_pretrained(tmp_path / "gemma")
    path = export_gguf(tmp_path / "gemma")["path"]
    reader = gguf.GGUFReader(path)
    assert _field(reader, "tokenizer.ggml.model") == "llama"
    types, scores = _field(reader, "tokenizer.ggml.token_type"), _field(reader, "tokenizer.ggml.scores")
    assert types[:4] == [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN]
    assert types[4:260] == [gguf.TokenType.BYTE] * 256 and types[299] == gguf.TokenType.NORMAL
    assert scores[280] > scores[290]  # earlier merges first
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, verbose=False)
    for text in ["one two three é", "seven  eight nine", "four"]:  # é by its bytes, two spaces, an unseen word
        assert llm.tokenize(text.encode(), add_bos=False, special=False) == fast.encode(text)
    llm.close()


def test_the_cli_writes_and_refuses_in_one_line(tb, tmp_path, tokenizer):
    """`tunebench export`: the file named on stdout; bad input one line, exit 2, the user's file untouched."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "model"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    code, out, err = tb("export", str(folder), "--format", "gguf", "--quant", "q8_0", "--json")
    assert code == 0, err
    done = json.loads(out)
    assert done["path"].endswith("model-q8_0.gguf") and done["quant"] == "q8_0" and done["arch"] == "llama"
    assert gguf.GGUFReader(done["path"]).fields["general.architecture"] is not None
    mine = tmp_path / "mine.gguf"
    mine.write_text("the user's")
    for argv, needle in [(("export", str(folder), "-o", str(mine)), "the file exists"),
                         (("export", str(tmp_path / "gone")), "not a folder"),
                         (("export", str(folder), "--quant", "q4_k"), "invalid choice")]:
        code, _, err = tb(*argv)
        assert code == 2 and needle in err and len(err.strip().splitlines()) <= 2, (argv, err)
    assert mine.read_text() == "the user's"
