"""Chat data masked as Hugging Face masks it.

Each family's template is written once with `{% generation %}` around what the assistant writes (as TRL's
training templates and transformers' own examples mark it), and used as shipped with the markers taken out
(rendering the same text). Our mask from the shipped template must equal, token by token, transformers'
`assistant_masks` from the marked one, with the same ids as `apply_chat_template`; and a chat job's first
evaluation must be the loss over that mask, computed here with transformers alone.
"""

import json
import math
import random
import re

import pytest
import torch

from tunebench.data import chat
from tunebench.data.examples import encode_chat

SPECIAL = ["<pad>", "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eot_id|>", "[INST]", "[/INST]", "<bos>", "<eos>", "<start_of_turn>",
           "<end_of_turn>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<|endoftext|>"]
WORDS = "hello there how are you doing today fine thanks the weather is sunny call tool result answer what time it".split()

# {bos, eos} and the marked template of each family; the shipped one is the same without the markers
FAMILIES = {
    "chatml": ("<s>", "<|im_end|>", (
        "{%- for message in messages %}"
        "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}{% generation %}"
        "{{- message.content }}"
        "{%- for call in message.tool_calls or [] %}{{- '<tool_call>\\n' + (call.function | tojson) + '\\n</tool_call>' }}"
        "{%- endfor %}{{- '<|im_end|>\\n' }}{% endgeneration %}"
        "{%- elif message.role == 'tool' %}"
        "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")),
    # reasoning kept only in the last turn, an empty reasoning block opening it, a newline before a tool call
    # only after content: earlier turns are written differently once later ones follow
    "qwen3": ("<s>", "<|im_end|>", (
        "{%- for message in messages %}"
        "{%- if message.role == 'assistant' %}{%- set answer = message.content.split('</think>')[-1].lstrip('\\n') %}"
        "{{- '<|im_start|>assistant\\n' }}{% generation %}"
        "{%- if loop.last and '</think>' in message.content %}{{- message.content }}"
        "{%- elif loop.last %}{{- '<think>\\n\\n</think>\\n\\n' + answer }}{%- else %}{{- answer }}{%- endif %}"
        "{%- for call in message.tool_calls or [] %}{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
        "{{- '<tool_call>\\n' + (call.function | tojson) + '\\n</tool_call>' }}{%- endfor %}"
        "{{- '<|im_end|>\\n' }}{% endgeneration %}"
        "{%- elif message.role == 'tool' %}"
        "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>", (
        "{{- bos_token }}{%- for message in messages %}"
        "{%- set role = 'ipython' if message.role == 'tool' else message.role %}"
        "{%- if message.role == 'assistant' %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
        "{% generation %}{{- message.content | trim + '<|eot_id|>' }}{% endgeneration %}"
        "{%- else %}{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")),
    # the system prompt goes with the last user message, as Mistral's newer templates write it
    "mistral": ("<s>", "</s>", (
        "{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}"
        "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
        "{%- set users = loop_messages | selectattr('role', 'equalto', 'user') | list %}"
        "{{- bos_token }}{%- for message in loop_messages %}"
        "{%- if message.role == 'user' %}"
        "{%- if system is defined and message == users[-1] %}{{- '[INST] ' + system + '\\n\\n' + message.content + '[/INST]' }}"
        "{%- else %}{{- '[INST] ' + message.content + '[/INST]' }}{%- endif %}"
        "{%- elif message.role == 'assistant' %}{% generation %}{{- ' ' + message.content | trim + eos_token }}"
        "{% endgeneration %}{%- endif %}{%- endfor %}")),
    "gemma": ("<bos>", "<eos>", (
        "{{- bos_token }}{%- if messages[0].role == 'system' %}{%- set prefix = messages[0].content + '\\n\\n' %}"
        "{%- set loop_messages = messages[1:] %}{%- else %}{%- set prefix = '' %}{%- set loop_messages = messages %}"
        "{%- endif %}{%- for message in loop_messages %}"
        "{%- if message.role == 'assistant' %}{{- '<start_of_turn>model\\n' }}{% generation %}"
        "{{- message.content | trim + '<end_of_turn>\\n' }}{% endgeneration %}"
        "{%- else %}{{- '<start_of_turn>user\\n' + (prefix if loop.first else '') + message.content | trim"
        " + '<end_of_turn>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}")),
    # the end-of-text token closes a conversation that ends with the assistant: only the last turn has it
    "phi3": ("<s>", "<|endoftext|>", (
        "{%- for message in messages %}"
        "{%- if message.role == 'assistant' %}{{- '<|assistant|>\\n' }}{% generation %}"
        "{{- message.content + '<|end|>\\n' }}{% endgeneration %}"
        "{%- else %}{{- '<|' + message.role + '|>\\n' + message.content + '<|end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}"
        "{%- elif messages[-1].role == 'assistant' %}{% generation %}{{- eos_token }}{% endgeneration %}"
        "{%- else %}{{- eos_token }}{%- endif %}")),
    # plain-text headers whose generation prompt ends in a space: " Hello" is one token, half prompt, half answer
    "vicuna": ("<s>", "</s>", (
        "{{- bos_token }}{%- for message in messages %}"
        "{%- if message.role == 'assistant' %}{{- 'ASSISTANT: ' }}{% generation %}{{- message.content + eos_token }}"
        "{% endgeneration %}{%- else %}{{- message.role.upper() + ': ' + message.content + '\\n' }}{%- endif %}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- 'ASSISTANT: ' }}{%- endif %}")),
}
TOOLS = ("chatml", "qwen3", "llama3", "phi3")  # the families here whose template writes tool calls and tool messages


def shipped(template: str) -> str:
    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)


def _corpus(rng: random.Random) -> list[str]:
    out = []
    for _ in range(600):
        words = rng.sample(WORDS, rng.randrange(2, 7))
        sep = rng.choice([" ", " ", "\n", "\n\n", "\n\n\n", ": ", " : "])
        out.append(sep.join(words) + rng.choice(["", ".", "\n", "  "]))
    return out


@pytest.fixture(scope="module")
def tokenizers_():
    """Two tokenizers trained here: byte-level BPE (GPT-2, Llama 3, Qwen) and a sentencepiece-like BPE
    (Llama 2, Mistral, Gemma: spaces as '▁'), every family's special tokens added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = _corpus(random.Random(0))
    made = {}
    for name, pre, dec in (("bytelevel", pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()),
                           ("metaspace", pre_tokenizers.Metaspace(prepend_scheme="first"), decoders.Metaspace())):
        t = Tokenizer(models.BPE(unk_token="<unk>"))
        t.pre_tokenizer, t.decoder = pre, dec
        extra = {"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()} if name == "bytelevel" else {}
        t.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIAL, **extra))
        made[name] = t.to_str()
    return made


def _tok(tokenizers_, kind: str, family: str, marked: bool = False):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    bos, eos, template = FAMILIES[family]
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizers_[kind]), bos_token=bos,
                                  eos_token=eos, pad_token="<pad>", unk_token="<unk>")
    tok.chat_template = template if marked else shipped(template)
    return tok


def _conversations(family: str) -> list[list[dict]]:
    m = lambda role, content, **kw: {"role": role, "content": content, **kw}  # noqa: E731
    convs = [
        [m("user", "hello there"), m("assistant", "fine thanks")],
        [m("system", "answer what is asked"), m("user", "how are you doing today?"), m("assistant", " fine, thanks "),
         m("user", "  the weather?\n"), m("assistant", "\nit is sunny.\n\n")],
        [m("user", "what time is it"), m("assistant", "\n\nthe time is fine"), m("user", "thanks"),
         m("assistant", "hello"), m("user", "today?"), m("assistant", "")],
        [m("system", "you are fine"), m("user", "hello"), m("assistant", "Hello there  "), m("user", "how"),
         m("assistant", " sunny")],
    ]
    if family in TOOLS:
        call = {"type": "function", "function": {"name": "time", "arguments": {"zone": "utc"}}}
        convs.append([m("user", "what time is it"), m("assistant", "", tool_calls=[call]), m("tool", "noon"),
                      m("assistant", "it is noon"), m("user", "thanks"), m("assistant", " fine")])
        convs.append([m("user", "how are you"), m("assistant", "<think>\nfine?\n</think>\n\nfine"),
                      m("user", "what time is it"), m("assistant", "let me call", tool_calls=[call, call]),
                      m("tool", "noon"), m("assistant", "<think>it is noon</think>noon")])
    return convs


def _ours(tok, msgs, train_all: bool = False):
    row = {"messages": json.dumps(msgs), "tools": ""}
    return encode_chat(tok, row, train_all)


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_shipped_template_masks_as_the_marked_one(tokenizers_, kind, family):
    """Token by token: our mask from the shipped template is transformers' assistant_masks from the marked one,
    the ids are apply_chat_template's, and every assistant message trains at least one token."""
    tok, ref = _tok(tokenizers_, kind, family), _tok(tokenizers_, kind, family, marked=True)
    assert chat.marked(ref.chat_template) and not chat.marked(tok.chat_template)
    for msgs in _conversations(family):
        want = ref.apply_chat_template(msgs, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = _ours(tok, msgs)
        assert ids == chat.ids_of(tok.apply_chat_template(msgs)) == list(want["input_ids"])
        shown = [(tok.convert_ids_to_tokens(i), int(a), int(b)) for i, a, b in zip(ids, mask, want["assistant_masks"])]
        assert [int(x) for x in mask] == list(want["assistant_masks"]), shown
        assert sum(mask) >= sum(1 for x in msgs if x["role"] == "assistant")
        # everything trains with train_on_prompt, over the same ids
        assert _ours(tok, msgs, train_all=True) == (ids, [True] * len(ids))


@pytest.mark.parametrize("family", ["chatml", "phi3"])
def test_a_marked_template_is_transformers_mask_exactly(tokenizers_, family):
    tok = _tok(tokenizers_, "bytelevel", family, marked=True)
    for msgs in _conversations(family):
        want = tok.apply_chat_template(msgs, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = _ours(tok, msgs)
        assert ids == list(want["input_ids"]) and [int(x) for x in mask] == list(want["assistant_masks"])


def _old_rule(tok, msgs) -> list[bool]:
    """The rule before: the tokens each assistant message adds after the tokens of the generation prompt."""
    count = lambda ms, prompt: len(chat.ids_of(tok.apply_chat_template(ms, add_generation_prompt=prompt)))  # noqa: E731
    ids = chat.ids_of(tok.apply_chat_template(msgs))
    mask = [False] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            start, end = count(msgs[:i], True), count(msgs[:i + 1], False)
            mask[start:end] = [True] * (end - start)
    return mask


@pytest.mark.parametrize("family,answer", [("vicuna", "hello there"), ("chatml", "\n\nthe weather")])
def test_a_token_merged_across_the_generation_prompt_trains(tokenizers_, family, answer):
    """The generation prompt ends in a space (vicuna) or a newline (ChatML) that merges with the answer's first
    characters into one token: the old token-count rule lost that token; it trains now, as in transformers."""
    tok, ref = _tok(tokenizers_, "bytelevel", family), _tok(tokenizers_, "bytelevel", family, marked=True)
    msgs = [{"role": "user", "content": "how are you"}, {"role": "assistant", "content": answer}]
    prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    text = tok.apply_chat_template(msgs, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    [merged] = [j for j, (a, b) in enumerate(enc["offset_mapping"]) if a < len(prompt) < b]  # the merge happened
    ids, mask = _ours(tok, msgs)
    old = _old_rule(tok, msgs)
    assert mask[merged] and not old[merged] and sum(old) == sum(mask) - 1
    assert [int(x) for x in mask] == ref.apply_chat_template(msgs, return_dict=True,
                                                             return_assistant_tokens_mask=True)["assistant_masks"]


def test_a_template_refusing_a_conversation_drops_that_row(tokenizers_):
    from tunebench.data.validate import BadRow

    tok = _tok(tokenizers_, "bytelevel", "chatml")
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(BadRow, match="the chat template refused it: roles must alternate"):
        _ours(tok, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])


def _prepared(tok, rows: list, tmp_path, **cfg):
    from tunebench.config import TrainConfig
    from tunebench.data.prepare import split_and_prepare

    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return split_and_prepare(TrainConfig(model="unused", data=str(data), **{"seq_len": 128, **cfg}), tok)[0]


def test_a_row_the_template_refuses_is_counted_and_refused_from_the_cache(tokenizers_, tmp_path, monkeypatch):
    """A conversation the template raises on is a damaged row like the others: counted by its reason, refused by
    strict_data (also when the rows come from the cache, whose key has no strict_data) and by max_bad_rows."""
    from tunebench.errors import UserError

    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))
    tok = _tok(tokenizers_, "bytelevel", "chatml")
    tok.chat_template = "{%- if messages[0].content == 'taboo' %}{{ raise_exception('no such topic') }}{%- endif %}" \
        + tok.chat_template
    turn = lambda q: {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "fine"}]}  # noqa: E731
    rows = [turn("hello")] * 5 + [turn("taboo")]
    reason = "the chat template refused it: no such topic"
    st = _prepared(tok, rows, tmp_path, max_bad_rows=0.2).stats
    assert st["examples"] == 5 and st["bad_rows"] == {reason: 1} and st["bad_rows_first"] == {reason: "line 6"}
    with pytest.raises(UserError, match=rf"chat.jsonl: line 6: {reason} \(strict_data refuses damaged rows\)"):
        _prepared(tok, rows, tmp_path, strict_data=True)
    with pytest.raises(UserError, match=r"1 of 6 rows are damaged \(16.7%, more than max_bad_rows=0.1\)"):
        _prepared(tok, rows, tmp_path)
    assert len(list((tmp_path / "cache").rglob("stats.json"))) == 1


def test_a_chat_template_that_does_not_parse_is_bad_input_naming_it(tokenizers_, tmp_path, monkeypatch):
    from tunebench.errors import UserError

    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))
    tok = _tok(tokenizers_, "bytelevel", "chatml")
    tok.chat_template = "{% for m in messages %}{{ m.content }}"  # the for never ends
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3
    with pytest.raises(UserError, match=r"its chat template does not parse \(line 1: .*\); fix chat_template"):
        _prepared(tok, rows, tmp_path)
    marked_ok = _tok(tokenizers_, "bytelevel", "chatml")  # `{% generation %}` parses, as transformers reads it
    marked_ok.chat_template = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    assert _prepared(marked_ok, rows, tmp_path).stats["examples"] == 3


class Chars:
    """A slow (Python) tokenizer, one token per character: transformers gives it no offsets."""

    @staticmethod
    def make(template: str):
        from transformers import PreTrainedTokenizer

        class _Chars(PreTrainedTokenizer):
            def __init__(self, **kw):
                self._vocab = {chr(i): i for i in range(32, 127)} | {"\n": 10}
                super().__init__(**kw)

            @property
            def vocab_size(self):
                return 128

            def get_vocab(self):
                return dict(self._vocab, **self.added_tokens_encoder)

            def _tokenize(self, text):
                return list(text)

            def _convert_token_to_id(self, t):
                return self._vocab.get(t, 0)

            def _convert_id_to_token(self, i):
                return chr(i)

        tok = _Chars(bos_token="<s>", eos_token="</s>", pad_token="<pad>")
        tok.chat_template = template
        return tok


def test_a_slow_tokenizer_is_refused_unless_everything_trains(tmp_path, monkeypatch):
    from tunebench.errors import UserError

    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))
    tok = Chars.make(shipped(FAMILIES["chatml"][2]))
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 4
    with pytest.raises(UserError, match="slow \\(Python\\) tokenizer gives no character offsets"):
        _prepared(tok, rows, tmp_path)
    st = _prepared(tok, rows, tmp_path, train_on_prompt=True).stats
    n = len(chat.ids_of(tok.apply_chat_template(rows[0]["messages"])))
    assert st["tokens"] == 4 * n and st["trained_tokens"] == 4 * (n - 1)


# --- a chat job's first evaluation against transformers' own mask -------------------------------------------

@pytest.fixture(scope="module")
def chat_model(tmp_path_factory, tokenizers_):
    """A tiny Llama whose tokenizer ships the ChatML template (no generation markers), and chat data."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("chat")
    tok = _tok(tokenizers_, "bytelevel", "chatml")
    tok.save_pretrained(root / "model")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(root / "model")
    rng = random.Random(1)

    def conv():
        msgs = [{"role": "system", "content": "be brief"}] if rng.random() < 0.5 else []
        for _ in range(rng.randrange(1, 3)):
            msgs += [{"role": "user", "content": " ".join(rng.sample(WORDS, 3))},
                     {"role": "assistant", "content": rng.choice(["", "\n", " ", "\n\n"]) + " ".join(rng.sample(WORDS, 3))}]
        return {"messages": msgs}

    for name, n in (("train", 24), ("eval", 6)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(conv()) + "\n" for _ in range(n)))
    return root


def test_first_evaluation_is_the_loss_over_transformers_assistant_mask(tb, chat_model, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("TUNEBENCH_CACHE", str(tmp_path / "cache"))
    code, out, err = tb("train", "--model", str(chat_model / "model"), "--data", str(chat_model / "train.jsonl"),
                        "--eval-data", str(chat_model / "eval.jsonl"), "--eval-every", "2", "--max-steps", "2",
                        "--warmup", "1", "--seq-len", "96", "--batch-size", "2", "--device", "cpu", "--precision",
                        "fp32", "--output-dir", str(tmp_path / "out"), "--no-store", "--json")
    assert code == 0, err
    job = json.loads(out)["metrics"]["job"]
    assert job["eval_data"]["truncated"] == 0 and job["eval_data"]["bad_rows"] == {}
    step, first = job["eval_curve"][0]

    plain = AutoTokenizer.from_pretrained(chat_model / "model")
    tok = AutoTokenizer.from_pretrained(chat_model / "model")
    tok.chat_template = FAMILIES["chatml"][2]  # the same template, marked
    model = AutoModelForCausalLM.from_pretrained(chat_model / "model", dtype=torch.float32).eval()
    total, count, old = 0.0, 0, 0
    for line in (chat_model / "eval.jsonl").read_text().splitlines():
        msgs = json.loads(line)["messages"]
        enc = tok.apply_chat_template(msgs, return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = list(enc["input_ids"]), enc["assistant_masks"]
        old += sum(_old_rule(plain, msgs)[1:])
        labels = torch.tensor([ids[j + 1] if mask[j + 1] else -100 for j in range(len(ids) - 1)] + [-100])
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        total += float(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"))
        count += int((labels != -100).sum())
    assert step == 0 and count == job["eval_data"]["trained_tokens"] > old  # the old rule lost merged tokens here
    assert first == pytest.approx(total / count, abs=1e-5) and math.isfinite(first)
