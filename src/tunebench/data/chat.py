"""A chat example through the tokenizer's chat template: its token ids, and which of them train.

The ids are `apply_chat_template`'s own: the conversation rendered as text by the template, then tokenized
without special tokens (the template writes its BOS itself when it has one), as transformers does.

Which tokens train, when only the assistant's do:

- A template that marks assistant output with `{% generation %}` ... `{% endgeneration %}` decides itself:
  the trained tokens are exactly transformers' `assistant_masks` (`return_assistant_tokens_mask=True`).
- Any other template (most shipped ones) is aligned on characters, never on token counts: a token count of a
  rendered prefix is wrong wherever the prefix's last characters merge with the next ones into one token (a
  generation prompt ending in a space or a newline). Each assistant message's span is the text between the
  generation prompt that precedes it and the end of its turn (the template's end-of-turn token, and what it
  writes after it before the next message, as the generation-marked versions of the same templates mark it);
  every token whose characters overlap a span trains, so a token merged across the boundary is kept.

The span is found from the template's own renderings: the conversation up to the message with the generation
prompt, and through the message. When those are prefixes of the whole conversation (ChatML, Llama 3, Gemma,
most templates) the span lies between their ends. Where a template writes an earlier turn differently once
later turns follow (an end-of-sequence token only after the last message, reasoning kept only in the last
turn, a system prompt moved to the last user message), the message's content is found by rendering the whole
conversation again with the content replaced by a marker, and the span is that content widened by what the
template writes between the generation prompt and the content, and after the content to the end of the turn.
Where the marker changes what the template writes (empty content beside tool calls), the turn as written last
is aligned on the conversation after the generation prompt. A message found none of these ways makes its row
a damaged one (validate.BadRow), counted, never trained with a guessed mask.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tunebench.data.validate import BadRow

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
MARKER = "\ue000tunebench-content\ue001"  # private-use characters: no template writes them, none trims them

Span = tuple[int, int]


def template_of(tok, tools: list | None = None) -> str | None:
    """The chat template transformers would use for this conversation (a named one for tools), or None."""
    try:
        return tok.get_chat_template(None, tools)
    except (ValueError, AttributeError, TypeError):  # no template (transformers raises), or an old tokenizer
        template = getattr(tok, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("default") or next(iter(template.values()), None)
        return template or None


def marked(template: str | None) -> bool:
    return bool(template and GENERATION.search(template))


def ids_of(out: Any) -> list[int]:
    """The ids `apply_chat_template(tokenize=True)` returned: a list (transformers 4), or a dict or
    BatchEncoding holding `input_ids` (transformers 5 returns a BatchEncoding, a UserDict: not a dict)."""
    if isinstance(out, Mapping) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(i) for i in out]


def encode(tok, msgs: list[dict], tools: list | None, train_all: bool) -> tuple[list[int], list[bool]]:
    """Token ids and the trained mask of one conversation (BadRow when the template refuses it)."""
    from jinja2 import TemplateError

    try:
        if marked(template_of(tok, tools)) and not train_all:
            out = tok.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            return ids_of(out), [bool(x) for x in out["assistant_masks"]]
        render = lambda ms, prompt: tok.apply_chat_template(ms, tools=tools, tokenize=False,  # noqa: E731
                                                            add_generation_prompt=prompt)
        text = render(msgs, False)
        if train_all:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            return ids, [True] * len(ids)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(o) for o in enc["offset_mapping"]]
        spans = [assistant_span(render, msgs, i, text, offsets) for i, m in enumerate(msgs) if m["role"] == "assistant"]
    except TemplateError as err:
        raise BadRow(f"the chat template refused it: {str(err).strip()[:80]}") from None
    if None in spans:
        raise BadRow("an assistant message is not where the chat template writes it")
    return list(enc["input_ids"]), overlapping(offsets, spans)


def overlapping(offsets: list[tuple[int, int]], spans: list[Span]) -> list[bool]:
    """Tokens whose characters overlap a span (an empty offset, which some tokenizers give a token, counts as
    its one position)."""
    return [any(a < e and max(b, a + 1) > s for s, e in spans) for a, b in offsets]


def assistant_span(render: Callable[[list, bool], str], msgs: list[dict], i: int, text: str,
                   offsets: list[tuple[int, int]]) -> Span | None:
    """The characters of `text` (the whole conversation) that assistant message i trains, or None."""
    before = render(msgs[:i], True) if i else None  # the conversation so far and the generation prompt
    through = render(msgs[:i + 1], False)
    if before is not None and through.startswith(before) and text.startswith(through):
        return len(before), len(through)
    return _by_marker(render, msgs, i, text, before, offsets) or _by_alignment(text, before, through, offsets)


def _by_marker(render, msgs: list[dict], i: int, text: str, before: str | None,
               offsets: list[tuple[int, int]]) -> Span | None:
    probe = [*msgs[:i], {**msgs[i], "content": MARKER}]
    whole = render(probe + msgs[i + 1:], False)
    if whole.count(MARKER) != 1:
        return None
    at = whole.index(MARKER)
    after = whole[at + len(MARKER):]
    c0, c1 = at, len(text) - len(after)  # the content's characters in text
    if c0 > c1 or text[:c0] != whole[:at] or text[c1:] != after:
        return None  # the template writes the rest of the conversation differently for another content
    turn = render(probe, False)  # the message as the last one: what the template writes around its content
    q = turn.index(MARKER)
    # what the template writes between the generation prompt (or where the turn leaves it: a prompt that opens
    # a reasoning block the rendered turn closes at once) and the content
    p = _common(before, turn) if before is not None else q
    gap = turn[p:q] if p <= q else ""
    start = c0 - len(gap) if gap and text[c0 - len(gap):c0] == gap else c0
    tail = turn[q + len(MARKER):]
    k = _common(tail, text[c1:c1 + len(tail)])
    end = c1 + k
    if k < len(tail):  # the turn ends inside what only a last message gets: stop at a token boundary
        end = max([b for a, b in offsets if b <= end] + [c1])
    return start, end


def _by_alignment(text: str, before: str | None, through: str, offsets: list[tuple[int, int]]) -> Span | None:
    """An assistant message the marker cannot stand for (empty content beside tool calls: a template writes a
    separator only before content that is there): the turn as the template writes it when last, aligned where
    it matches the most of what follows the generation prompt in the conversation (a last turn may open with
    what earlier ones leave out, an empty reasoning block)."""
    if before is None or not text.startswith(before):
        return None
    start = len(before)
    turn = through[_common(before, through):]
    rest = text[start:start + len(turn)]
    best, at = 0, 0  # the longest match, and where in the turn it starts (the first such place)
    for j in range(len(turn)):
        k = _common(turn[j:], rest)
        if k > best:
            best, at = k, j
    if best == 0:
        return None
    end = start + best
    if at + best < len(turn):  # the turn ends inside what only a last message gets: stop at a token boundary
        end = max([b for a, b in offsets if b <= end] + [start])
    return start, end


def _common(a: str, b: str) -> int:
    """Length of the common prefix of a and b."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
