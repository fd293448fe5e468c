"""Which rows can train, and why the others cannot: every row is checked against its shape before any of it
is tokenized, so a missing, null or non-string field is never trained on as the text "None" or a repr.

A damaged row is dropped and counted under its reason (the labels below, stable and few, so that counts add
up across a file); `strict_data` refuses the first one instead, and more than `max_bad_rows` of them (a
share of the rows read) refuses the data: that many damaged rows is a wrong field name or a wrong file more
often than a few bad records.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tunebench.errors import UserError

VERSION = 1  # of the checks and of the rows they keep: a change here changes which rows train
ROLES = ("system", "user", "assistant", "tool")
SHAPES = ("chat", "pairs", "text", "preference")


class BadRow(Exception):
    """A row found damaged once tokenizing (the chat template refused it, or its assistant text could not be
    found in what the template wrote): counted like the rows the checks below drop."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Fields(NamedTuple):
    """The field names each shape reads (config keys text_field, prompt_field, ...)."""

    text: str = "text"
    prompt: str = "prompt"
    completion: str = "completion"
    messages: str = "messages"
    chosen: str = "chosen"
    rejected: str = "rejected"

    @classmethod
    def of(cls, cfg) -> Fields:
        return cls(cfg.text_field, cfg.prompt_field, cfg.completion_field, cfg.messages_field,
                   getattr(cfg, "chosen_field", "chosen"), getattr(cfg, "rejected_field", "rejected"))

    def needed(self, shape: str) -> list[str]:
        """The fields a shape cannot do without (a preference row's prompt may live in its conversations)."""
        return {"chat": [self.messages], "pairs": [self.prompt, self.completion], "text": [self.text],
                "preference": [self.chosen, self.rejected]}[shape]


def kind(value: Any) -> str:
    """A JSON value's kind in words ("a number", "null"), for the reason labels."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _string(row: dict, name: str) -> str | None:
    if name not in row:
        return f"missing field '{name}'"
    if not isinstance(row[name], str):
        return f"field '{name}' is {kind(row[name])}"
    return None


def _message(m: Any) -> str | None:
    if not isinstance(m, dict):
        return f"a message is {kind(m)}, not an object"
    role = m.get("role")
    if role is None:
        return "a message has no role"
    if role not in ROLES:
        return f"unknown role {str(role)[:30]!r}" if isinstance(role, str) else f"a message's role is {kind(role)}"
    if "content" not in m and not m.get("tool_calls"):
        return "a message has no content"
    content = m.get("content")
    if content is None and role == "assistant" and m.get("tool_calls"):
        return None if isinstance(m["tool_calls"], list) else f"a message's tool_calls is {kind(m['tool_calls'])}"
    if not isinstance(content, str):
        return f"a message's content is {kind(content)}"
    return None


def _conversation(msgs: Any, name: str) -> str | None:
    if not isinstance(msgs, list):
        return f"field '{name}' is {kind(msgs)}"
    if not msgs:
        return f"field '{name}' holds no messages"
    return next((p for p in map(_message, msgs) if p), None)


def _preference(row: dict, fields: Fields) -> str | None:
    """A pair of answers: prompt, chosen and rejected all text, or all conversations (the answers' last message the
    assistant's); without a prompt, chosen and rejected are whole conversations sharing all but their last message."""
    names = ([fields.prompt] if fields.prompt in row else []) + [fields.chosen, fields.rejected]
    missing = next((f"missing field '{n}'" for n in names if n not in row), None)
    if missing:
        return missing
    values = [row[n] for n in names]
    if all(isinstance(v, str) for v in values):
        return None if fields.prompt in row else f"missing field '{fields.prompt}'"
    if not all(isinstance(v, list) for v in values):
        odd = next((n for n, v in zip(names, values) if not isinstance(v, (str, list))), None)
        return f"field '{odd}' is {kind(row[odd])}" if odd else "text and conversations mixed in one pair"
    bad = next((p for n, v in zip(names, values) if (p := _conversation(v, n))), None)
    if bad:
        return bad
    chosen, rejected = row[fields.chosen], row[fields.rejected]
    if chosen[-1].get("role") != "assistant" or rejected[-1].get("role") != "assistant":
        return "an answer's last message is not the assistant's"
    if fields.prompt not in row and chosen[:-1] != rejected[:-1]:
        return "chosen and rejected have different prompts"
    return None


def problem(row: Any, shape: str, fields: Fields) -> str | None:
    """Why `row` cannot train as `shape`, or None when it can."""
    if not isinstance(row, dict):
        return f"the row is {kind(row)}, not an object"
    if shape == "preference":
        return _preference(row, fields)
    if shape != "chat":
        return next(filter(None, (_string(row, f) for f in fields.needed(shape))), None)
    msgs = row.get(fields.messages)
    if fields.messages not in row:
        return f"missing field '{fields.messages}'"
    if not isinstance(msgs, list):
        return f"field '{fields.messages}' is {kind(msgs)}"
    if not msgs:
        return "no messages"
    tools = row.get("tools")
    if tools is not None and not isinstance(tools, list):
        return f"field 'tools' is {kind(tools)}"
    return next((p for p in map(_message, msgs) if p), None)


def kept(row: dict, shape: str, fields: Fields) -> dict[str, str]:
    """A row that passed `problem`, as the fixed string columns the tokenizer reads: text; prompt and
    completion; or messages and tools as JSON (a message keeps every key it has, tool_calls included, for
    the chat template to render; an assistant's null content beside tool_calls becomes "")."""
    if shape == "text":
        return {"text": row[fields.text]}
    if shape == "pairs":
        return {"prompt": row[fields.prompt], "completion": row[fields.completion]}
    if shape == "preference":  # each side as JSON (text or messages); an implicit prompt split off the conversations
        chosen, rejected = row[fields.chosen], row[fields.rejected]
        prompt = row.get(fields.prompt)
        if prompt is None:
            prompt, chosen, rejected = chosen[:-1], chosen[-1:], rejected[-1:]
        clean = (lambda v: v if isinstance(v, str) else [  # noqa: E731
            {**{k: x for k, x in m.items() if x is not None}, "content": m.get("content") or ""} for m in v])
        tools = row.get("tools")
        return {"prompt": json.dumps(clean(prompt), default=str), "chosen": json.dumps(clean(chosen), default=str),
                "rejected": json.dumps(clean(rejected), default=str),
                "tools": json.dumps(tools, default=str) if tools else ""}
    # a key set to null is left out, as JSON rows leave it out: Parquet gives every message every struct key,
    # and templates test `'tool_calls' in message`
    msgs = [{**{k: v for k, v in m.items() if v is not None}, "content": m.get("content") or ""}
            for m in row[fields.messages]]
    tools = row.get("tools")
    return {"messages": json.dumps(msgs, default=str), "tools": json.dumps(tools, default=str) if tools else ""}


@dataclass
class Tally:
    """Rows read and damaged rows by reason, with where each reason was first seen ("line 12")."""

    read: int = 0
    bad: Counter = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)
    earliest: tuple[str, str] | None = None  # (where, reason) of the first damaged row

    def add(self, reason: str, where: str) -> None:
        self.bad[reason] += 1
        self.first.setdefault(reason, where)
        self.earliest = self.earliest or (where, reason)

    @property
    def damaged(self) -> int:
        return sum(self.bad.values())

    def merged(self, other: Tally) -> Tally:
        return Tally(self.read, self.bad + other.bad, {**other.first, **self.first}, self.earliest or other.earliest)

    def stats(self) -> dict[str, Any]:
        """The counts as the prepared data's stats keep them (and the record's metrics.job.data)."""
        return {"rows_read": self.read, "bad_rows": dict(self.bad.most_common()),
                "bad_rows_first": {r: self.first[r] for r, _ in self.bad.most_common()},
                "first_bad_row": list(self.earliest) if self.earliest else None}

    @classmethod
    def of(cls, stats: dict[str, Any]) -> Tally:
        """The tally kept in `stats` (none in stats written before they kept one)."""
        first = stats.get("first_bad_row")
        return cls(stats.get("rows_read", 0), Counter(stats.get("bad_rows", {})), dict(stats.get("bad_rows_first", {})),
                   tuple(first) if first else None)

    def summary(self, most: int = 4) -> str:
        """'missing field 'completion' 3, a message's content is null 1' (the commonest first)."""
        parts = [f"{r} {n:,}" for r, n in self.bad.most_common(most)]
        return ", ".join(parts) + (", ..." if len(self.bad) > most else "")


def enforce(tally: Tally, cfg, what: str, data: str, rows: int | None = None) -> None:
    """Refuse damaged rows as the config asks: the first one under strict_data, or more than max_bad_rows of
    the `rows` (default: the rows read)."""
    if not tally.bad:
        return
    if cfg.strict_data:
        where, reason = tally.earliest
        raise UserError(f"invalid {what}={data}: {where}: {reason} (strict_data refuses damaged rows)")
    total = rows if rows is not None else tally.read
    share = tally.damaged / max(total, 1)
    if share > cfg.max_bad_rows:
        raise UserError(f"invalid {what}={data}: {tally.damaged:,} of {total:,} rows are damaged ({share:.1%}, more "
                        f"than max_bad_rows={cfg.max_bad_rows:g}): {tally.summary()}; the first at {tally.earliest[0]}")

