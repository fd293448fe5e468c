"""What `tunebench train` leaves to serve (trainer.export): a merged model that generates as the adapter does, with
its KV cache on and the tokenizer's stop ids; the merge computed in fp32, then cast; the tokenizer with its chat
template beside every output; and the learning rate each log line shows, the one its step ran at.

A tiny Llama folder with a ChatML tokenizer trained here; every job on the CPU in fp32 (QLoRA in bf16).
"""

import contextlib
import copy
import io
import json
import random
import re

import pytest
import torch
from safetensors.torch import load_file

from conftest import bpe_tokenizer

WORDS = "zero one two three four five six seven eight nine ten".split()
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """A Llama-shaped model folder (random weights) beside a BPE tokenizer with a chat template and no padding
    token (the generation config's falls back to the end-of-sequence token)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("outputs")
    rng = random.Random(0)
    texts = [" ".join(WORDS[a:a + rng.randrange(3, 6)]) for a in (rng.randrange(0, 6) for _ in range(300))]
    fast = bpe_tokenizer(texts, ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"], 200, bos_token="<s>",
                         eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHATML
    fast.save_pretrained(root / "model")
    cfg = LlamaConfig(vocab_size=208, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(root / "model")
    (root / "text.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return root


def _args(local, out, *extra: str) -> list[str]:
    return ["train", "--model", str(local / "model"), "--data", str(local / "text.jsonl"), "--seq-len", "32",
            "--batch-size", "4", "--lr", "3e-3", "--device", "cpu", "--precision", "fp32", "--warmup", "1",
            "--output-dir", str(out), "--no-store", "--json", *extra]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def lora(local, tmp_path_factory):
    """A LoRA job merged in fp32, logging every step: (output folder, its stderr)."""
    from tunebench.cli import main

    out = tmp_path_factory.mktemp("lora") / "out"
    argv = _args(local, out, "--method", "lora", "--lora-rank", "8", "--max-steps", "8", "--merge", "--merge-dtype",
                 "fp32", "--log-every", "1", "--warmup-steps", "3", "--schedule", "linear")
    err = io.StringIO()  # the log lines (capsys is per test)
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setenv("TUNEBENCH_CACHE", str(out.parent / "cache"))
        assert main(argv) == 0
    return out, err.getvalue()


def _tokenizer_is_beside(folder, local) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    assert (folder / "chat_template.jinja").is_file() and tok.chat_template == CHATML
    msgs = [{"role": "user", "content": "one two"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        "<|im_start|>user\none two<|im_end|>\n<|im_start|>assistant\n"
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(local / "model").get_vocab()


def _ready_to_generate(folder) -> None:
    """config.json with the KV cache on, generation_config.json with the tokenizer's ids (no padding token: its
    end-of-sequence one)."""
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["use_cache"] is True
    gen = GenerationConfig.from_pretrained(folder)
    assert tok.pad_token_id is None and tok.eos_token_id is not None
    assert gen.use_cache is True and gen.eos_token_id == gen.pad_token_id == tok.eos_token_id
    assert gen.bos_token_id == tok.bos_token_id


def test_merged_generates_as_the_adapter_does(lora, local):
    """Greedy decoding with the KV cache, token for token: the merged model (fp32) against the adapter over its
    base. The adapter must matter: the base alone decodes otherwise."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = lora
    _ready_to_generate(out / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
    assert merged.dtype == torch.float32 and merged.config.use_cache and merged.generation_config.use_cache
    base = AutoModelForCausalLM.from_pretrained(local / "model").eval()
    adapted = PeftModel.from_pretrained(base, out / "adapter").eval()
    tok = AutoTokenizer.from_pretrained(out / "merged")
    differs = False
    with torch.no_grad():
        for prompt in ("one two", "four five six", "seven", "two three four five"):
            ids = torch.tensor([tok(prompt)["input_ids"]])
            kw = dict(max_new_tokens=10, do_sample=False, use_cache=True)
            want = adapted.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
            got = merged.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
            assert got.tolist() == want.tolist(), prompt
            torch.testing.assert_close(merged(want).logits, adapted(want).logits, atol=1e-4, rtol=1e-4)
            with adapted.disable_adapter():
                differs |= adapted.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw).tolist() != \
                    want.tolist()
    assert differs


def test_bf16_merge_is_the_fp32_merge_cast(lora, local, tmp_path):
    """merge_dtype=bf16 rounds the fp32 merge once: equal to the fp32 merge cast to bf16, element for element,
    and not what a merge computed in bf16 gives (its update and sum rounded too)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunebench.config import TrainConfig
    from tunebench.models.save import generation_config
    from tunebench.models.spec import resolve_model
    from tunebench.trainer.export import merge

    out, _ = lora
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(local / "model"), out / "adapter")
    cfg = TrainConfig(model=str(local / "model"), data=str(local / "text.jsonl"), method="lora", merge_dtype="bf16")
    tok = AutoTokenizer.from_pretrained(out / "adapter")
    merge(model, model.state_dict(), cfg, resolve_model(cfg.model), tok, generation_config(tok, None, True),
          tmp_path / "bf16")
    fp32, bf16 = load_file(out / "merged" / "model.safetensors"), load_file(tmp_path / "bf16" / "model.safetensors")
    assert fp32.keys() == bf16.keys() and all(t.dtype == torch.bfloat16 for t in bf16.values())
    assert all(torch.equal(bf16[k], fp32[k].to(torch.bfloat16)) for k in fp32)
    base, adapter = load_file(local / "model" / "model.safetensors"), load_file(out / "adapter" / "adapter_model.safetensors")
    scale = json.loads((out / "adapter" / "adapter_config.json").read_text())
    scale = scale["lora_alpha"] / scale["r"]
    rounded_twice = 0
    for k, a in adapter.items():
        if ".lora_A." in k:
            key = k.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            b = adapter[k.replace(".lora_A.", ".lora_B.")]
            assert not torch.equal(fp32[key], base[key])  # the adapter moved it
            in_bf16 = base[key].to(torch.bfloat16) + (scale * b @ a).to(torch.bfloat16)
            rounded_twice += int(not torch.equal(in_bf16, bf16[key]))
    assert rounded_twice > 0


def test_tokenizer_and_template_beside_every_output(lora, local, tmp_path):
    from tunebench.cli import main

    out, _ = lora
    for folder in (out / "adapter", out / "merged"):
        _tokenizer_is_beside(folder, local)
    full = tmp_path / "full"
    assert main(_args(local, full, "--max-steps", "2")) == 0
    _tokenizer_is_beside(full / "model", local)
    _ready_to_generate(full / "model")


def test_log_line_shows_the_rate_its_step_ran_at(lora):
    """Linear warmup over 3 steps from 1/3 of the rate (the first step already learns), then linear decay to 0
    over the remaining 5: step N runs at lr·f(N-1)."""
    _, err = lora
    lines = re.findall(r"^train: step (\d+)/8, .*?lr ([0-9.e+-]+)", err, re.M)
    assert [int(n) for n, _ in lines] == list(range(1, 9))

    def factor(k: int) -> float:
        return (k + 1) / 3 if k < 3 else 1 - (k - 3) / 5

    assert [x for _, x in lines] == [f"{3e-3 * factor(int(n) - 1):.3g}" for n, _ in lines]
    assert lines[0][1] == "0.001" and lines[-1][1] == "0.0006"


def test_qlora_merge_is_the_fp32_dequantized_base_plus_the_update(local, tmp_path, tb):
    """Each merged weight equals bf16(dequantize_4bit(W) in fp32 + scale·B·A): the base rebuilt as the job built it
    (tunebench.models.build, the same NF4 bytes), the adapter read from adapter/."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as bf

    from tunebench.config import TrainConfig
    from tunebench.models.build import from_pretrained, train_weights

    out = tmp_path / "q"
    code, _, err = tb(*_args(local, out, "--method", "qlora", "--max-steps", "3", "--merge", "--precision", "bf16"))
    assert code == 0, err
    cfg = TrainConfig(model=str(local / "model"), data=str(local / "text.jsonl"), method="qlora", precision="bf16")
    base = from_pretrained(local / "model", train_weights(cfg), torch.device("cpu"))
    merged = load_file(out / "merged" / "model.safetensors")
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    acfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    quantized = {n: m for n, m in base.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert quantized and set(merged) == set(load_file(local / "model" / "model.safetensors"))
    fp32_first = 0
    for name, m in quantized.items():
        state = copy.copy(m.weight.quant_state)
        state.dtype = torch.float32
        w = bf.dequantize_4bit(m.weight.data, state)
        a = adapter[f"base_model.model.{name}.lora_A.weight"]
        b = adapter[f"base_model.model.{name}.lora_B.weight"]
        update = acfg["lora_alpha"] / acfg["r"] * b.float() @ a.float()
        assert w.dtype == torch.float32 and torch.equal(merged[f"{name}.weight"], (w + update).to(torch.bfloat16))
        fp32_first += int(not torch.equal(merged[f"{name}.weight"], (w.to(torch.bfloat16).float() + update)
                                          .to(torch.bfloat16)))
    assert fp32_first > 0  # dequantized to bf16 first, some weights would come out otherwise
    for k, v in merged.items():  # the unquantized rest (embeddings, norms, head): the base's, in bf16
        if k.removesuffix(".weight") not in quantized:
            assert torch.equal(v, base.state_dict()[k].to(torch.bfloat16)), k


def test_generation_config_keeps_the_models_own_end_ids_and_sampling(local, tmp_path):
    """A model folder whose generation config stops at two ids and samples: its tokenizer's eos comes first and the
    other end id stays (the tokenizer is the model's own), its sampling defaults stay; with another tokenizer only
    that tokenizer's ids."""
    from transformers import AutoTokenizer, GenerationConfig

    from tunebench.models.save import generation_config

    GenerationConfig(bos_token_id=1, eos_token_id=[9, 2], do_sample=True, temperature=0.6).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(local / "model")
    own, other = generation_config(tok, tmp_path, True), generation_config(tok, tmp_path, False)
    assert own.eos_token_id == [2, 9] and other.eos_token_id == 2 == own.pad_token_id == other.pad_token_id
    assert own.do_sample and own.temperature == 0.6 and own.use_cache and own.bos_token_id == 1


def test_merge_keeps_an_adapter_on_other_than_a_linear_layer(local, tmp_path):
    """An adapter on an embedding (as on a mixture of experts' 3-D weights, peft's other layer kinds) is merged by
    peft's own merge, not dropped: the merged model computes what the adapted one does."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunebench.config import TrainConfig
    from tunebench.models.save import generation_config
    from tunebench.models.spec import resolve_model
    from tunebench.trainer.export import merge

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(local / "model"),
                           LoraConfig(r=4, target_modules=["q_proj", "embed_tokens"], init_lora_weights=False)).eval()
    cfg = TrainConfig(model=str(local / "model"), data=str(local / "text.jsonl"), method="lora", merge_dtype="fp32")
    tok = AutoTokenizer.from_pretrained(local / "model")
    merge(model, model.state_dict(), cfg, resolve_model(cfg.model), tok, generation_config(tok, None, True), tmp_path)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    with torch.no_grad():
        want = model(ids).logits
        with model.disable_adapter():
            assert (model(ids).logits - want).abs().max() > 1e-2  # the adapters matter
        torch.testing.assert_close(merged(ids).logits, want, atol=1e-5, rtol=1e-5)
