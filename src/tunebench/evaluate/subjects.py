"""What `tunebench eval` scores: a model folder, a peft adapter on its base, or a training job's output folder
(its merged model, full model or adapter, and the base it started from).

Every folder is checked before any weights are read, so a bad path is one line; the loading itself happens
later, one model at a time, so two models are never in memory at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebench.errors import UserError

WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


@dataclass
class Subject:
    role: str  # fine-tuned | base | model
    folder: Path  # what is scored (an adapter's folder for an adapter)
    base: Path | None  # an adapter's base model folder
    tokenizer: Path  # the folder whose tokenizer the harness uses
    train_record: str | None = None
    output_dir: Path | None = None

    def load(self, dtype, device: str) -> tuple[Any, Any]:
        """The model (an adapter merged into its base: the same function, one plain model) and its tokenizer."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(self.base or self.folder, dtype=dtype, local_files_only=True)
        if self.base is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, self.folder).merge_and_unload()
        tok = AutoTokenizer.from_pretrained(self.tokenizer, local_files_only=True)
        return model.to(device).eval(), tok


def _bad(target: str, why: str) -> UserError:
    return UserError(f"invalid model={target}: {why}")


def _model_folder(path: Path, target: str, what: str) -> Path:
    if not (path / "config.json").is_file():
        raise _bad(target, f"{what} {path} has no config.json (give a Hugging Face model folder)")
    if not any(next(path.glob(p), None) for p in WEIGHTS):
        raise _bad(target, f"{what} {path} holds no weights (*.safetensors or pytorch_model*.bin)")
    return path


def _adapter(path: Path, target: str, base: Path | None, role: str, **kw: Any) -> Subject:
    if not (path / "adapter_model.safetensors").is_file() and not (path / "adapter_model.bin").is_file():
        raise _bad(target, f"the adapter {path} has no adapter_model.safetensors")
    if base is None:
        name = _json(path / "adapter_config.json", target).get("base_model_name_or_path")
        base = Path(name).expanduser() if name else None
        if base is None or not base.is_dir():
            raise _bad(target, f"the adapter's base {name!r} is not a local folder; evaluate a merged model "
                               "(train --merge) or give the base as a folder")
    _model_folder(base, target, "the adapter's base")
    tok = path if (path / "tokenizer_config.json").is_file() else base
    return Subject(role, path, base, tok, **kw)


def _plain(path: Path, target: str, role: str, **kw: Any) -> Subject:
    return Subject(role, _model_folder(path, target, "the model folder"), None, path, **kw)


def _json(path: Path, target: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise _bad(target, f"{path.name} cannot be read ({type(err).__name__})") from None
    if not isinstance(value, dict):
        raise _bad(target, f"{path.name} is not a JSON object")
    return value


def _job(out: Path, target: str, with_base: bool, note: Callable[[str], None]) -> list[Subject]:
    """A training job's output folder: the trained model first, then its base."""
    config = _json(out / "run.json", target).get("config") or {}
    record = out / "record.json"
    rec_id = _json(record, target).get("id") if record.is_file() else None
    kw = {"train_record": rec_id, "output_dir": out}
    base_name = str(config.get("model", ""))
    base = Path(base_name).expanduser() if base_name and Path(base_name).expanduser().is_dir() else None
    if (out / "merged").is_dir():
        trained = _plain(out / "merged", target, "fine-tuned", **kw)
    elif (out / "model").is_dir():
        trained = _plain(out / "model", target, "fine-tuned", **kw)
    elif (out / "adapter").is_dir():
        if base is None:
            raise _bad(target, f"the job's base {base_name!r} is a preset with random weights, not a folder: train "
                               "with --merge to evaluate its merged model")
        trained = _adapter(out / "adapter", target, base, "fine-tuned", **kw)
    else:
        raise _bad(target, "the job wrote no model yet (no merged/, model/ or adapter/): let it finish, or "
                           "--resume it")
    subjects = [trained]
    if with_base:
        if base is None:
            note(f"eval: the base {base_name!r} is a preset with random weights: not scored")
        else:
            subjects.append(_plain(base, target, "base", **kw))
    return subjects


def _vocabulary_fits(subject: Subject, target: str) -> Subject:
    """The tokenizer's ids index the model's embeddings: a larger tokenizer is refused before anything loads."""
    from transformers import AutoTokenizer

    config = _json((subject.base or subject.folder) / "config.json", target)
    rows = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    try:
        size = len(AutoTokenizer.from_pretrained(subject.tokenizer, local_files_only=True))
    except Exception as err:  # noqa: BLE001 - any loader's failure is the folder's fault, said in one line
        raise _bad(target, f"the tokenizer in {subject.tokenizer} cannot be loaded ({type(err).__name__})") from None
    if isinstance(rows, int) and size > rows:
        raise _bad(target, f"the tokenizer in {subject.tokenizer} has {size:,} tokens, more than the model's "
                           f"{rows:,} embeddings")
    return subject


def subjects(target: str, with_base: bool, note: Callable[[str], None]) -> list[Subject]:
    """What to score for `target`, checked (folders, weights, the tokenizer against the embeddings) but not
    loaded."""
    return [_vocabulary_fits(s, target) for s in _found(target, with_base, note)]


def _found(target: str, with_base: bool, note: Callable[[str], None]) -> list[Subject]:
    path = Path(target).expanduser()
    if not path.exists():
        raise _bad(target, "no such folder (give a model folder, an adapter folder or a train output_dir)")
    if not path.is_dir():
        raise _bad(target, "not a folder (give a model folder, an adapter folder or a train output_dir)")
    if (path / "run.json").is_file():
        return _job(path, target, with_base, note)
    if (path / "adapter_config.json").is_file():
        return [_adapter(path, target, None, "model")]
    return [_plain(path, target, "model")]
