"""What a config field's annotation and default say, read alike by the flags (`--help`) and the reference docs."""

from __future__ import annotations

import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic_core import PydanticUndefined

REQUIRED = PydanticUndefined  # a field without a default


def alternatives(annotation: object) -> tuple:
    """The members of a union (`int | None`), or the annotation alone."""
    return get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)


def words(annotation: object) -> list:
    """The words a field takes (its Literal members), in order."""
    return [w for a in alternatives(annotation) if get_origin(a) is Literal for w in get_args(a)]


def default_value(field: Any) -> Any:
    """The field's default, a factory's made; REQUIRED where it has none."""
    return field.default_factory() if field.default_factory is not None else field.default
