"""One example into token ids and which of them are trained on: text, prompt/completion pairs, or chat.

Text trains on every token. Pairs and chat train on the completion / assistant tokens only, unless
`train_on_prompt`. The rows come checked (validate.py): every field read here is a string, messages are JSON.
Chat is rendered with the tokenizer's chat template and masked as chat.py says; a tokenizer without a template
gets the simple one in tokenizer.py (a `<|role|>` line, then the content; the end-of-sequence token after each
assistant message), so any tokenizer can train on chat data.
"""

from __future__ import annotations

import json

from tunebench.data import chat
from tunebench.data.tokenizer import SIMPLE_HEADER
from tunebench.data.validate import BadRow, Fields
from tunebench.errors import UserError

Encoded = tuple[list[int], list[bool]]


def detect(columns: list[str], cfg) -> str:
    """The data's shape: the configured one, or the first whose fields the data has (chat, pairs, text); preference
    pairs for a preference objective."""
    fields = Fields.of(cfg)
    preference = getattr(cfg, "objective", "sft") != "sft"
    order = ["preference"] if preference else [cfg.data_format] if cfg.data_format != "auto" else ["chat", "pairs",
                                                                                                    "text"]
    for shape in order:
        if all(f in columns for f in fields.needed(shape)):
            return shape
    if not preference and all(f in columns for f in fields.needed("preference")):
        raise UserError(f"invalid data: its rows are preference pairs ({fields.chosen}, {fields.rejected}): train "
                        "them with objective dpo, simpo or orpo")
    want = " or ".join("+".join(fields.needed(s)) for s in order)
    if preference:
        want = f"{fields.prompt}+{want}"
    raise UserError(f"invalid data: no field {want} (the data has: {', '.join(columns)}); set "
                    f"{'text_field' if order == ['text'] else 'the *_field keys'} to the field names it uses")


def _ids(tok, text: str, first: bool) -> list[int]:
    return tok(text, add_special_tokens=first)["input_ids"]


def _eos(tok) -> list[int]:
    return [tok.eos_token_id] if tok.eos_token_id is not None else []


def encode_text(tok, row: dict[str, str], train_on_prompt: bool) -> Encoded:
    ids = _ids(tok, row["text"], True) + _eos(tok)
    return ids, [True] * len(ids)


def encode_pair(tok, row: dict[str, str], train_on_prompt: bool) -> Encoded:
    prompt = _ids(tok, row["prompt"], True)
    completion = _ids(tok, row["completion"], False) + _eos(tok)
    return prompt + completion, [train_on_prompt] * len(prompt) + [True] * len(completion)


def _simple(tok, msgs: list[dict], train_all: bool) -> Encoded:
    ids: list[int] = []
    mask: list[bool] = []
    for m in msgs:
        if m.get("tool_calls") and not m["content"]:
            raise BadRow("a tool call, which only a chat template can write")
        head = _ids(tok, SIMPLE_HEADER.format(role=m["role"]), not ids)
        body = _ids(tok, m["content"] + "\n", False)
        if m["role"] == "assistant":
            body += _eos(tok)
        ids += head + body
        mask += [train_all] * len(head) + [train_all or m["role"] == "assistant"] * len(body)
    return ids, mask


def encode_chat(tok, row: dict[str, str], train_on_prompt: bool) -> Encoded:
    msgs = json.loads(row["messages"])
    tools = json.loads(row["tools"]) if row.get("tools") else None
    if not getattr(tok, "chat_template", None):
        return _simple(tok, msgs, train_on_prompt)
    return chat.encode(tok, msgs, tools, train_on_prompt)


def _answer_only(tok, prompt: list[dict], answer: list[dict], tools: list | None) -> Encoded:
    """The conversation `prompt + answer` through the chat template, training on the answer's assistant messages
    alone (the prompt's own assistant turns are context): the mask's last runs, one per assistant message."""
    msgs = prompt + answer
    if not getattr(tok, "chat_template", None):
        ids, mask = _simple(tok, msgs, False)
    else:
        ids, mask = chat.encode(tok, msgs, tools, False)
    runs = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]  # where each trained run starts
    earlier = sum(m["role"] == "assistant" for m in prompt)
    if len(runs) != earlier + sum(m["role"] == "assistant" for m in answer):
        raise BadRow("an assistant message is not where the chat template writes it")
    start = runs[earlier] if earlier < len(runs) else len(mask)
    return ids, [m and i >= start for i, m in enumerate(mask)]


def encode_preference(tok, row: dict[str, str], train_on_prompt: bool) -> tuple[Encoded, Encoded]:
    """A pair of answers to one prompt: (chosen, rejected), each the prompt then the answer, trained on the answer's
    tokens. Text is tokenized as pairs are (the prompt with special tokens, the answer and end-of-sequence after
    it); conversations through the chat template."""
    prompt, chosen, rejected = (json.loads(row[k]) for k in ("prompt", "chosen", "rejected"))
    if isinstance(prompt, str):
        return tuple(encode_pair(tok, {"prompt": prompt, "completion": a}, False) for a in (chosen, rejected))
    tools = json.loads(row["tools"]) if row.get("tools") else None
    return _answer_only(tok, prompt, chosen, tools), _answer_only(tok, prompt, rejected, tools)


ENCODERS = {"text": encode_text, "pairs": encode_pair, "chat": encode_chat, "preference": encode_preference}
