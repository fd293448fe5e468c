"""Command-line flags made from the config models, shared by the CLI and by `deploy` (which checks the
`tunebench run ...` it is asked to deploy exactly as `run` would parse it)."""

from __future__ import annotations

import argparse
import shutil
from typing import Any, NoReturn, get_origin

from pydantic import BaseModel

from tunebench.config import RunConfig, load_config
from tunebench.config.annotations import REQUIRED, alternatives, default_value, words
from tunebench.config.topics import topics_of
from tunebench.errors import UserError


class HelpFormatter(argparse.HelpFormatter):
    """Help that reads as a reference card: options and their help side by side, up to 110 columns wide."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        width = min(shutil.get_terminal_size().columns, 110) - 2
        super().__init__(prog, max_help_position=30, width=width)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, argparse.BooleanOptionalAction):  # --[no-]grad-ckpt: one switch, one line
            return "--[no-]" + action.option_strings[0][2:]
        return super()._format_action_invocation(action)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        # no abbreviations: `--nnod 4` must not pass for `--nnodes 4` (deploy checks forwarded flags by name)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line and exit 2, no usage dump
        raise UserError(message)


def _is_bool(annotation: object) -> bool:
    """bool, or bool | None (an unset switch that means 'decide for me')."""
    return annotation is bool or set(alternatives(annotation)) == {bool, type(None)}


def _is_switch_or_word(annotation: object) -> bool:
    """bool | Literal["auto"]: a switch that also takes a word (`--compile`, `--no-compile`, `--compile auto`)."""
    return bool in alternatives(annotation) and bool(words(annotation))


def _switch_or_word(value: str) -> bool | str:
    low = value.strip().lower()
    return {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}.get(low, low)


def _is_list(annotation: object) -> bool:
    return any(get_origin(a) is list for a in alternatives(annotation))


def _metavar(annotation: object) -> str:
    """{a,b,c} for a field that takes one of a few words, else what kind of value it takes."""
    if choices := words(annotation):
        return "{" + ",".join(str(w) for w in choices) + "}"
    kinds = set(alternatives(annotation))
    return "N" if int in kinds else "X" if float in kinds else "TEXT"


def _default(field: Any) -> str:
    value = default_value(field)
    if isinstance(value, list):
        return f" (default {','.join(map(str, value))})" if value else ""
    return "" if value is None or value is REQUIRED else f" (default {value})"


def add_config_flags(p: argparse.ArgumentParser, cls: type[BaseModel] = RunConfig) -> None:
    """One flag per config field, same name with dashes, grouped by topic (config.topics); None means 'not given'
    so YAML keeps its value."""
    for topic, names in topics_of(cls).items():
        group = p.add_argument_group(topic)
        for name in names:
            _add_flag(group, name, cls.model_fields[name])


def _add_flag(p: Any, name: str, field: Any) -> None:
    flag = "--" + name.replace("_", "-")
    help_ = (field.description or "").replace("%", "%%")  # argparse %-formats help
    if help_.startswith("testing the harness only"):
        help_ = argparse.SUPPRESS
    if _is_bool(field.annotation):
        on = {True: " (default on)", False: " (default off)"}.get(field.default, "")
        p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_ + on)
    elif _is_switch_or_word(field.annotation):
        p.add_argument(flag, dest=name, nargs="?", const=True, type=_switch_or_word, default=None,
                       metavar="|".join(words(field.annotation)), help=f"{help_} (default {field.default})")
        p.add_argument("--no-" + flag[2:], dest=name, action="store_const", const=False, help=argparse.SUPPRESS)
    elif _is_list(field.annotation):
        p.add_argument(flag, dest=name, action="append", default=None, help=help_ + " (repeatable)")
    else:
        shown = help_ if help_ == argparse.SUPPRESS else (help_ + _default(field)).strip()
        p.add_argument(flag, dest=name, default=None, metavar=_metavar(field.annotation), help=shown)


DATA_FIELDS = ("data", "tokenizer", "data_format", "text_field", "prompt_field", "completion_field", "messages_field",
               "chosen_field", "rejected_field",
               "train_on_prompt", "packing", "epochs", "max_steps", "eval_data", "eval_fraction", "max_bad_rows")


def add_data_flags(p: argparse.ArgumentParser) -> None:
    """A training job's data keys (TrainConfig's), for `plan --data` to count the job's tokens."""
    from tunebench.config import TrainConfig

    group = p.add_argument_group("the job's data (plan --data: its tokens counted, the whole job's time and cost)")
    for name in DATA_FIELDS:
        _add_flag(group, name, TrainConfig.model_fields[name])


def add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, help="results database (default $TUNEBENCH_STORE or "
                                                  "./tunebench-results/results.db)")


def add_run_options(run: argparse.ArgumentParser) -> None:
    """`tunebench run`'s arguments: a YAML config, every RunConfig key as a flag, and what to do with the record."""
    run.usage = "%(prog)s [CONFIG.yaml] [--KEY VALUE ...] [--gpus N,N,...] [--json] [--no-store] [--store PATH]"
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

    tr.usage = "%(prog)s [CONFIG.yaml] --data PATH [--KEY VALUE ...] [--json] [--no-store] [--store PATH]"
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
