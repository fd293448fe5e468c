"""One example into token ids and which of them are trained on: text, prompt/completion pairs, or chat.

Text trains on every token. Pairs and chat train on the completion / assistant tokens only, unless
`train_on_prompt`. Chat is rendered with the tokenizer's chat template; the assistant tokens are the ones
each assistant message adds to the rendered conversation. A tokenizer without a template gets the simple
one in tokenizer.py (a `<|role|>` line, then the content; the end-of-sequence token after each assistant
message), so any tokenizer can train on chat data.
"""

from __future__ import annotations

from typing import Any

from tunebench.data.tokenizer import SIMPLE_HEADER
from tunebench.errors import UserError

ROLES = ("system", "user", "assistant", "tool")


def detect(columns: list[str], cfg) -> str:
    """The data's shape: the configured one, or the first whose fields the data has (chat, pairs, text)."""
    need = {"chat": [cfg.messages_field], "pairs": [cfg.prompt_field, cfg.completion_field],
            "text": [cfg.text_field]}
    order = [cfg.data_format] if cfg.data_format != "auto" else ["chat", "pairs", "text"]
    for shape in order:
        if all(f in columns for f in need[shape]):
            return shape
    want = " or ".join("+".join(need[s]) for s in order)
    raise UserError(f"invalid data: no field {want} (the data has: {', '.join(columns)}); set "
                    f"{'text_field' if order == ['text'] else 'the *_field keys'} to the field names it uses")


def _ids(tok, text: str, first: bool) -> list[int]:
    return tok(text, add_special_tokens=first)["input_ids"]


def encode_text(tok, row: dict[str, Any], cfg) -> tuple[list[int], list[bool]]:
    ids = _ids(tok, str(row[cfg.text_field]), True) + ([tok.eos_token_id] if tok.eos_token_id is not None else [])
    return ids, [True] * len(ids)


def encode_pair(tok, row: dict[str, Any], cfg) -> tuple[list[int], list[bool]]:
    prompt = _ids(tok, str(row[cfg.prompt_field]), True)
    completion = _ids(tok, str(row[cfg.completion_field]), False)
    completion += [tok.eos_token_id] if tok.eos_token_id is not None else []
    return prompt + completion, [cfg.train_on_prompt] * len(prompt) + [True] * len(completion)


def check_messages(msgs: Any, index: int) -> None:
    """One chat example's messages: a non-empty list of role/content with known roles (UserError otherwise)."""
    _messages({"m": msgs}, "m", index)


def _messages(row: dict[str, Any], field: str, index: int) -> list[dict[str, str]]:
    msgs = row[field]
    if not isinstance(msgs, list) or not msgs:
        raise UserError(f"invalid data: example {index} has no messages (expected a list of role/content)")
    for m in msgs:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise UserError(f"invalid data: example {index} has a message without role and content: {m!r}"[:300])
        if m["role"] not in ROLES:
            raise UserError(f"invalid data: example {index} has a message with unknown role {m['role']!r} "
                            f"(roles are {', '.join(ROLES)})")
    return [{"role": m["role"], "content": str(m["content"])} for m in msgs]


def _simple(tok, msgs: list[dict[str, str]], train_all: bool) -> tuple[list[int], list[bool]]:
    ids: list[int] = []
    mask: list[bool] = []
    for m in msgs:
        head = _ids(tok, SIMPLE_HEADER.format(role=m["role"]), not ids)
        body = _ids(tok, m["content"] + "\n", False)
        if m["role"] == "assistant" and tok.eos_token_id is not None:
            body.append(tok.eos_token_id)
        ids += head + body
        mask += [train_all] * len(head) + [train_all or m["role"] == "assistant"] * len(body)
    return ids, mask


def encode_chat(tok, row: dict[str, Any], cfg, index: int = 0) -> tuple[list[int], list[bool]]:
    msgs = _messages(row, cfg.messages_field, index)
    if not getattr(tok, "chat_template", None):
        return _simple(tok, msgs, cfg.train_on_prompt)

    def rendered(upto: int, prompt: bool) -> list[int]:
        out = tok.apply_chat_template(msgs[:upto], tokenize=True, add_generation_prompt=prompt)
        return list(out["input_ids"] if isinstance(out, dict) else out)

    ids = rendered(len(msgs), False)
    mask = [cfg.train_on_prompt] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":  # the tokens this message adds, after the prompt that precedes it
            start, end = len(rendered(i, True)), len(rendered(i + 1, False))
            mask[start:end] = [True] * (min(end, len(ids)) - start)
    return ids, mask
