"""Command-line flags made from the config models, shared by the CLI and by `deploy` (which checks the
`tunebench run ...` it is asked to deploy exactly as `run` would parse it)."""

from __future__ import annotations

import argparse
import types
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

from pydantic import BaseModel

from tunebench.config import RunConfig, load_config
from tunebench.errors import UserError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 2, no usage dump
        raise UserError(message)


def _is_bool(annotation: object) -> bool:
    """bool, or bool | None (an unset switch that means 'decide for me')."""
    if get_origin(annotation) in (Union, types.UnionType):
        return set(get_args(annotation)) == {bool, type(None)}
    return annotation is bool


def _is_switch_or_word(annotation: object) -> bool:
    """bool | Literal["auto"]: a switch that also takes a word (`--compile`, `--no-compile`, `--compile auto`)."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
    return bool in args and any(get_origin(a) is Literal for a in args)


def _switch_or_word(value: str) -> bool | str:
    low = value.strip().lower()
    return {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}.get(low, low)


def _is_list(annotation: object) -> bool:
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_is_list(a) for a in get_args(annotation))
    return get_origin(annotation) is list


def add_config_flags(p: argparse.ArgumentParser, cls: type[BaseModel] = RunConfig) -> None:
    """One flag per config field, same name with dashes; None means 'not given' so YAML keeps its value."""
    for name, field in cls.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_ = (field.description or "").replace("%", "%%")  # argparse %-formats help ("8-18% faster")
        if _is_bool(field.annotation):
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        elif _is_switch_or_word(field.annotation):
            words = "|".join(w for a in get_args(field.annotation) if get_origin(a) is Literal for w in get_args(a))
            p.add_argument(flag, dest=name, nargs="?", const=True, type=_switch_or_word, default=None,
                           metavar=words, help=f"{help_} (default {field.default})")
            p.add_argument("--no-" + flag[2:], dest=name, action="store_const", const=False, help=argparse.SUPPRESS)
        elif _is_list(field.annotation):
            p.add_argument(flag, dest=name, action="append", default=None, help=help_ + " (repeatable)")
        else:
            p.add_argument(flag, dest=name, default=None, help=f"{help_} (default {field.default})".strip())


def add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, help="results database (default $TUNEBENCH_STORE or "
                                                  "./tunebench-results/results.db)")


def add_run_options(run: argparse.ArgumentParser) -> None:
    """`tunebench run`'s arguments: a YAML config, every RunConfig key as a flag, and what to do with the record."""
    run.add_argument("config", nargs="?", help="YAML run config; flags override its keys")
    add_config_flags(run)
    run.add_argument("--gpus", help="scaling: run the same per-GPU config at each of these world sizes "
                                    "(e.g. 1,2,4; processes on CPU) and report speedup and efficiency")
    run.add_argument("--json", action="store_true", help="print the record as JSON on stdout")
    run.add_argument("--no-store", action="store_true", help="do not write the record to the store")
    run.add_argument("--print-result", action="store_true", help="also print the record between markers "
                                                                 "(for logs: tunebench collect reads them)")
    add_store(run)


def add_train_options(tr: argparse.ArgumentParser) -> None:
    """`tunebench train`'s arguments: a YAML config, every TrainConfig key as a flag, and the record's output."""
    from tunebench.config import TrainConfig

    tr.add_argument("config", nargs="?", help="YAML train config; flags override its keys")
    add_config_flags(tr, TrainConfig)
    tr.add_argument("--json", action="store_true", help="print the record as JSON on stdout")
    tr.add_argument("--no-store", action="store_true", help="do not write the record to the store")
    tr.add_argument("--print-result", action="store_true", help="also print the record between markers "
                                                                "(for logs: tunebench collect reads them)")
    add_store(tr)


def config_from(args: argparse.Namespace, cls: type[BaseModel] = RunConfig, **fixed: Any) -> Any:
    """The validated config of parsed arguments: the YAML file, the flags over it, then `fixed` over both."""
    for name, field in cls.model_fields.items():
        value = getattr(args, name, None)
        # `--compile run.yaml`: a switch that takes a word took the config file; give it back
        if (_is_switch_or_word(field.annotation) and isinstance(value, str) and value.endswith((".yaml", ".yml"))
                and getattr(args, "config", "") is None):
            args.config, value = value, True
            setattr(args, name, value)
    overrides = {name: getattr(args, name, None) for name in cls.model_fields} | fixed
    return load_config(getattr(args, "config", None), cls, **overrides)


def parse_run(argv: list[str], command: str = "run") -> argparse.Namespace:
    """`run ...` (or `train ...`) arguments as that command parses them (without running anything)."""
    p = Parser(prog=f"tunebench {command}", add_help=False)
    (add_train_options if command == "train" else add_run_options)(p)
    return p.parse_args(argv)
