"""The tasks of `tunebench eval`: names from lm-evaluation-harness's registry, or local task YAML files.

A local file's relative data files are read from its own folder (the harness would read them from the current
one). Every task is built (its dataset read) before a model is loaded, so an unknown name, a missing data file
or a dataset that is not in the local cache is one line, early. The harness's datasets come from the local
Hugging Face cache unless `download` lets it reach the Hub: offline is the default, and fails at once.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunebench.errors import UserError

MAX_TASK_FILE = 1 << 20  # a task definition is a page of YAML; anything larger is not one
LOCAL_FORMATS = {"json", "csv", "parquet", "text", "arrow"}  # datasets' builders that read data_files


def _is_file_spec(spec: str) -> bool:
    return spec.endswith((".yaml", ".yml")) or os.sep in spec


def _local_task(spec: str) -> dict[str, Any]:
    """A task YAML (its includes and !function tags as the harness reads them), data files made absolute."""
    from lm_eval.tasks._yaml_loader import load_yaml

    path = Path(spec).expanduser()
    if not path.is_file():
        raise UserError(f"invalid tasks={spec}: no such task file")
    if path.stat().st_size > MAX_TASK_FILE:
        raise UserError(f"invalid tasks={spec}: {path.stat().st_size:,} bytes, more than a task file holds")
    try:
        cfg = load_yaml(path)
    except Exception as err:  # the harness's loader: YAML, includes and !function imports each fail their own way
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise UserError(f"invalid tasks={spec}: cannot be read as a task ({first})") from None
    if not isinstance(cfg.get("task"), str):
        raise UserError(f"invalid tasks={spec}: has no `task:` name (a group file is not supported; give its tasks)")
    if cfg.get("dataset_path") in LOCAL_FORMATS:
        kwargs = dict(cfg.get("dataset_kwargs") or {})
        kwargs["data_files"] = _absolute(kwargs.get("data_files"), path.parent, spec)
        cfg["dataset_kwargs"] = kwargs
    return cfg


def _absolute(files: Any, folder: Path, spec: str) -> Any:
    if isinstance(files, dict):
        return {k: _absolute(v, folder, spec) for k, v in files.items()}
    if isinstance(files, list):
        return [_absolute(v, folder, spec) for v in files]
    if not isinstance(files, str):
        raise UserError(f"invalid tasks={spec}: dataset_kwargs.data_files must name the task's data files")
    path = Path(files).expanduser()
    path = path if path.is_absolute() else folder / path
    if not path.is_file():
        raise UserError(f"invalid tasks={spec}: its data file {path} does not exist")
    return str(path)


@contextlib.contextmanager
def hub_access(download: bool) -> Iterator[None]:
    """The harness's datasets from the local cache only, unless `download`: set for the block, then restored."""
    if download:
        yield
        return
    import datasets.config
    import huggingface_hub.constants as hub

    saved = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE, os.environ.get("HF_DATASETS_OFFLINE"))
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved[:2]
        if saved[2] is None:
            os.environ.pop("HF_DATASETS_OFFLINE", None)
        else:
            os.environ["HF_DATASETS_OFFLINE"] = saved[2]


@functools.cache
def _registry() -> Any:
    """The harness's task index, built once a process (it reads every task file the harness ships)."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


def build(specs: list[str], download: bool) -> list[Any]:
    """Every task built (its data read), in the order given: the harness's task and group objects."""
    from tunebench.errors import require

    require("lm_eval", "eval", "pip install lm_eval")
    from lm_eval.tasks import TaskManager

    local = [s for s in specs if _is_file_spec(s)]
    named = [s for s in specs if not _is_file_spec(s)]
    manager = _registry() if named else TaskManager(include_defaults=False)  # local tasks travel as dicts
    for name in named:  # the registry's index: every task, group and tag name
        if name not in manager.all_tasks:
            close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.6)
            hint = f" (close: {', '.join(close)})" if close else " (lm_eval --tasks list shows them all)"
            raise UserError(f"invalid tasks={name}: no such task in lm-evaluation-harness{hint}")
    built: list[Any] = []
    with hub_access(download):
        for spec in specs:
            task = _local_task(spec) if spec in local else spec
            name = task["task"] if isinstance(task, dict) else task
            try:
                loaded = manager.load([task])
            except (ConnectionError, FileNotFoundError, OSError, ValueError) as err:
                first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
                if download:
                    raise UserError(f"invalid tasks={spec}: its dataset cannot be read ({first})") from None
                raise UserError(f"invalid tasks={spec}: its dataset is not in the local cache ({first}); download it "
                                "where the Hugging Face Hub is reachable (tunebench eval --download), or give a "
                                "local task YAML") from None
            # a group keeps its aggregate score; a tag is its tasks
            built += [g for g in loaded["groups"].values() if g.name == name] or list(loaded["tasks"].values())
    return built
