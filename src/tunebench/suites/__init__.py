"""Suites: a named set of run configurations, from a YAML file or one shipped here.

A suite has ``name``, ``base`` (a run config), ``axes`` (field -> list of values; the grid is their
product) and/or ``runs`` (partial configs laid over ``base``, each optionally named). With both,
every run is crossed with the grid. ``--set key=value`` overrides are laid over everything last.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tunebench.config import RunConfig, build_config, read_yaml
from tunebench.config.yamlfile import load_yaml_text
from tunebench.errors import UserError

SUITE_KEYS = {"name", "description", "base", "axes", "runs"}


@dataclass(frozen=True)
class Entry:
    name: str
    config: RunConfig


def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__package__).iterdir()
                  if p.name.endswith(".yaml"))


def load_suite(ref: str) -> dict[str, Any]:
    """A built-in suite by name, or a YAML file."""
    if ref in builtin_names():
        data = yaml.safe_load(resources.files(__package__).joinpath(f"{ref}.yaml").read_text())
    elif Path(ref).suffix in (".yaml", ".yml") or Path(ref).exists():
        data = read_yaml(ref)
    else:
        raise UserError(f"invalid suite={ref}: not a built-in suite ({', '.join(builtin_names())}) nor a YAML file")
    unknown = set(data) - SUITE_KEYS
    if unknown:
        raise UserError(f"suite {ref}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(SUITE_KEYS))})")
    if not data.get("axes") and not data.get("runs"):
        raise UserError(f"suite {ref}: needs 'axes' or 'runs' (or both)")
    return data


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """`key=value` pairs; values are read as YAML scalars (8 -> int, true -> bool, 2e-4 -> str->float later)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"invalid --set {item!r}: expected key=value")
        out[key.strip().replace("-", "_")] = load_yaml_text(value, f"--set {item!r}'s value")
    return out


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{what} must be a mapping of config keys to values")
    return value


MAX_CONFIGURATIONS = 10_000  # a sweep runs each one: far beyond any real sweep


def expand(suite: dict[str, Any], sets: dict[str, Any] | None = None) -> list[Entry]:
    """Every configuration of the suite, validated; identical configurations are kept once."""
    base = _mapping(suite.get("base"), "suite 'base'")
    axes = _mapping(suite.get("axes"), "suite 'axes'")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise UserError(f"suite axis {key!r} must be a non-empty list of values")
    runs = suite.get("runs") or [{}]
    if not isinstance(runs, list):
        raise UserError("suite 'runs' must be a list of partial configs")
    size = math.prod(len(v) for v in axes.values()) * len(runs)  # counted before anything is expanded
    if size > MAX_CONFIGURATIONS:
        raise UserError(f"the suite makes {size:,} configurations ({' x '.join(str(len(v)) for v in axes.values())} "
                        f"axes values x {len(runs)} runs): at most {MAX_CONFIGURATIONS:,}; split it or narrow its axes")
    grid = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())] if axes else [{}]
    entries, seen = [], set()
    for i, run in enumerate(runs):
        run = dict(_mapping(run, f"suite run {i + 1}"))
        run_name = str(run.pop("name", "") or "")
        for point in grid:
            label = ", ".join(x for x in [run_name, ", ".join(f"{k}={v}" for k, v in point.items())] if x)
            label = label or f"run {len(entries) + 1}"
            try:
                cfg = build_config(base | run | point | (sets or {}), RunConfig)
            except UserError as err:
                raise UserError(f"suite entry '{label}': {err}") from None
            if cfg.config_hash() not in seen:
                seen.add(cfg.config_hash())
                entries.append(Entry(label, cfg))
    return entries


def definition(name: str, entries: list[Entry], repeats: int) -> dict[str, Any]:
    """A sweep as the store keeps it: every configuration in full, so it can be resumed as it was."""
    return {"name": name, "repeats": repeats,
            "entries": [{"name": e.name, "config": e.config.model_dump()} for e in entries]}


def from_definition(d: dict[str, Any]) -> tuple[str, list[Entry], int]:
    """(name, entries, repeats) of a stored sweep definition; one damaged past reading is refused in words."""
    try:
        return (str(d["name"]), [Entry(str(e["name"]), RunConfig.model_validate(e["config"])) for e in d["entries"]],
                int(d["repeats"]))
    except (KeyError, TypeError, ValueError, ValidationError) as err:
        raise UserError(f"sweep definition {d.get('name', '?') if isinstance(d, dict) else '?'!r} is damaged "
                        f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}): run its configurations "
                        "anew") from None


def names_by_hash(d: dict[str, Any]) -> dict[str, str]:
    """Each configuration's name in a stored sweep, by config hash (reports label runs with them); none for a
    damaged definition (the runs are shown by their configurations instead)."""
    try:
        return {e.config.config_hash(): e.name for e in from_definition(d)[1]}
    except UserError:
        return {}
