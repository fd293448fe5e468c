"""What every configuration shares: field roles (a run's identity), the hash, YAML, one-line errors.

Everything that can be checked without building a model is checked by the config classes, so bad
input fails in well under a second with one line naming the field, the value and what is allowed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ValidationError

from tunebench.config.yamlfile import load_yaml_file
from tunebench.errors import UserError, invalid

# A run's identity, declared once on its fields. Every field is part of the workload unless marked:
#   launch:      where and how it runs (tags, rendezvous, timeouts): left out of the config hash;
#   measurement: how it is measured (seed, steps, device): in the hash, but not a lever a report compares.
# The config hash (sweep resume, compare, report grouping) and the report's levers derive from this.
LAUNCH = {"role": "launch"}
MAX_SEED = 2**32 - 1  # what every generator seeded from it (torch, numpy, Python) takes
MEASUREMENT = {"role": "measurement"}


def fields_with_role(cls: type[BaseModel], *roles: str) -> set[str]:
    return {n for n, f in cls.model_fields.items() if (f.json_schema_extra or {}).get("role") in roles}


# Fields added after configs were first stored leave the hash unchanged at their default, so stored sweeps
# still resume and compare: json_schema_extra={"since": ...} (with a role where one applies).
LATER = {"since": "0.2"}


def identity(cls: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """The part of a config (as a dict) that says what the workload is: launch fields removed, later fields
    left out where they hold their default."""
    launch = fields_with_role(cls, "launch")
    later = {n: f.default for n, f in cls.model_fields.items() if "since" in (f.json_schema_extra or {})}
    return {k: v for k, v in data.items() if k not in launch and not (k in later and v == later[k])}


def workload_key(cls: type[BaseModel], data: dict[str, Any]) -> str:
    """The workload without how it was measured (steps, seed, device) or launched: a benchmark and a training
    job of the same configuration share it."""
    skip = fields_with_role(cls, "launch", "measurement")
    return config_hash({k: v for k, v in identity(cls, data).items() if k in cls.model_fields and k not in skip})


def not_levers(cls: type[BaseModel]) -> set[str]:
    """Fields two configurations may differ in without being different experiments."""
    return fields_with_role(cls, "launch", "measurement")


def config_hash(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_bytes(v: Any) -> Any:
    """'32K', '1M', '1G' (binary, as nccl-tests reads -b/-e) or a plain integer number of bytes."""
    if isinstance(v, str):
        t = v.strip().upper().removesuffix("IB").removesuffix("B")
        unit = t[-1:] if t[-1:] in UNITS else ""
        if not t[: len(t) - len(unit)].isdigit():
            raise ValueError(f"{v!r} is not a size (use bytes or a number with K, M or G)")
        return int(t[: len(t) - len(unit)]) * UNITS[unit]
    return v


# Labels stored with records; one given alone (`--tag x`, `tag: x`) is a list of one.
Tags = Annotated[list[str], BeforeValidator(lambda v: [v] if isinstance(v, str) else v)]


def listify(v: Any) -> Any:
    """A list from YAML, a repeated flag, or one comma-separated string ('bf16,nf4', '1,8,32')."""
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return [y.strip() for x in v for y in x.split(",") if y.strip()]
    return v


def _one_line(err: ValidationError, raw: dict[str, Any], fields: tuple[str, ...]) -> str:
    """Turn pydantic's multi-line report into one line naming field, value and what is allowed."""
    errors = err.errors()
    e = errors[0]
    loc = [p for p in e["loc"] if not isinstance(p, int) and not _union_member(p)]  # not a list index, not a type
    field = ".".join(str(p) for p in loc) or "config"
    if len(e["loc"]) != len(loc) and any(_union_member(p) for p in e["loc"]):  # true | false | 'auto': each said
        same = [x["msg"] for x in errors if [p for p in x["loc"] if not _union_member(p)] == loc]
        e = e | {"msg": "; or ".join(dict.fromkeys(same))}
    if e["type"] == "extra_forbidden":
        return f"unknown key {field!r} (allowed keys: {', '.join(fields)})"
    if e["type"] == "missing":
        return f"missing {field}: give --{field.replace('_', '-')} (or the {field} key of the YAML config)"
    msg = e["msg"].removeprefix("Value error, ")
    if not e["loc"]:  # model-level check: the message already names the fields
        return f"invalid config: {msg}"
    return str(invalid(field, raw.get(field, e.get("input")), msg))


def _union_member(part: Any) -> bool:
    """pydantic names the member of a union (bool, literal['auto']) in an error's location."""
    return isinstance(part, str) and (part in ("bool", "int", "float", "str")
                                      or part.startswith(("literal[", "function-")))


def _numeric_only(annotation: Any) -> bool:
    """A field that takes numbers and never true/false (int, float, or either or None)."""
    import types
    import typing

    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    kinds = {a for a in (args or (annotation,)) if a is not type(None)}
    return bool(kinds) and kinds <= {int, float}


def build_config(data: dict[str, Any], cls: type[BaseModel]) -> Any:
    for key, value in data.items():  # pydantic would take true as 1: YAML's `seq_len: yes` is a mistake, not 1
        field = cls.model_fields.get(key)
        if isinstance(value, bool) and field is not None and _numeric_only(field.annotation):
            raise UserError(f"invalid {key}={str(value).lower()}: a number is needed, not true/false")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise UserError(_one_line(err, data, tuple(cls.model_fields))) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    data = load_yaml_file(p)
    if data is None:
        raise UserError(f"config file {str(p)!r} is empty: give at least one key, or leave the file out")
    if not isinstance(data, dict):
        raise UserError(f"config file {str(p)!r} must hold a mapping of keys to values, not {type(data).__name__}")
    return data


def load_config(path: str | Path | None, cls: type[BaseModel], **overrides: Any) -> Any:
    """YAML file (optional) with keyword overrides laid over it; overrides set to None are ignored."""
    data = read_yaml(path) if path else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    return build_config(data, cls)
