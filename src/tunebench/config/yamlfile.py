"""YAML a user gives, read with limits: size, nesting depth, aliases (no billion laughs), and no duplicate keys.

PyYAML takes the last of two equal keys silently and expands every alias it meets; a config file is small, flat
and written by hand, so anything past these limits is refused in one line naming the file, the line and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tunebench.errors import UserError

MAX_BYTES = 1 << 20  # a config, suite or price sheet is a few KB
MAX_DEPTH = 32  # nested mappings and lists
MAX_ALIASES = 100  # `*name` references in one document
MAX_VALUES = 100_000  # values once every alias is expanded (nested aliases multiply)


class _Bounded(yaml.SafeLoader):
    """SafeLoader that counts what it composes and refuses a mapping's second equal key."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(f"uses more than {MAX_ALIASES} aliases (*name) at line "
                               f"{self.peek_event().start_mark.line + 1}: write the values out")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nests more than {MAX_DEPTH} levels deep at line {self.peek_event().start_mark.line + 1}")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`, merged by the constructor
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise _Refused(f"has the key {key!r} twice (lines {seen[key]} and {line}): keep one")
            if isinstance(key, (str, int, float, bool)):
                seen[key] = line
        return super().construct_mapping(node, deep)


class _Refused(Exception):
    pass


def load_yaml_text(text: str, what: str) -> Any:
    """`text` as YAML under the limits; `what` names it in the error ("config file 'x.yaml'")."""
    if len(text.encode()) > MAX_BYTES:
        raise UserError(f"{what} is larger than {MAX_BYTES >> 10} KiB: a config file is a few keys")
    try:
        data = yaml.load(text, Loader=_Bounded)  # a SafeLoader
        _expanded(data, what)
        return data
    except _Refused as err:
        raise UserError(f"{what} {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{what} is not valid YAML{where}") from None
    except RecursionError:
        raise UserError(f"{what} nests too deep") from None


def _expanded(data: Any, what: str) -> None:
    """Refuse a document whose aliases expand to more than MAX_VALUES values: pydantic and every printout would
    expand them (each alias is one shared object while loaded)."""
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise UserError(f"{what} expands to more than {MAX_VALUES:,} values through its aliases: write it out")
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def load_yaml_file(path: str | Path, what: str = "config file") -> Any:
    """A YAML file the user names, under the limits; a missing, special or unreadable file is refused by name."""
    p = Path(path)
    label = f"{what} {str(p)!r}"
    if not p.is_file():
        raise UserError(f"{label} does not exist" if not p.exists() else f"{label} is not a regular file")
    if p.stat().st_size > MAX_BYTES:
        raise UserError(f"{label} is larger than {MAX_BYTES >> 10} KiB: a config file is a few keys")
    try:
        text = p.read_text()
    except UnicodeDecodeError as err:
        raise UserError(f"{label} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise UserError(f"{label} cannot be read: {err.strerror}") from None
    return load_yaml_text(text, label)
