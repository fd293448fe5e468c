"""Local data files into a `datasets.Dataset`: JSONL/JSON, CSV, Parquet, plain text, a folder of them, or a
folder written by `save_to_disk`. Nothing is ever fetched from a hub."""

from __future__ import annotations

import os
from pathlib import Path

from tunebench.errors import UserError

BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text", ".md": "text",
            ".py": "text"}


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "state.json").is_file()
                              or (path / "dataset_dict.json").is_file())


def _files(path: Path) -> tuple[str, list[str]]:
    """The builder and the files of a file or a folder (one format per folder)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in BUILDERS)
    if not files:
        raise UserError(f"invalid data={path}: no data files in it ({', '.join(sorted(BUILDERS))})")
    kinds = {BUILDERS.get(f.suffix) for f in files}
    if None in kinds:
        raise UserError(f"invalid data={path}: {files[0].suffix or 'no extension'} is not a data file format "
                        f"({', '.join(sorted(BUILDERS))})")
    if len(kinds) > 1:
        raise UserError(f"invalid data={path}: the folder mixes formats ({', '.join(sorted(kinds))}); keep one")
    return kinds.pop(), [str(f) for f in files]


def load(path_text: str, what: str = "data"):
    """The dataset at `path_text` (a Dataset, its split 'train' if it is a DatasetDict); refuses an empty one."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()  # reading local files takes seconds; tokenizing has its own progress

    path = Path(path_text).expanduser()
    if not path.exists():
        raise UserError(f"invalid {what}={path_text}: does not exist")
    if path.is_file() and path.stat().st_size == 0:
        raise UserError(f"invalid {what}={path_text}: the file is empty")
    try:
        if _is_saved_dataset(path):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds["train"] if "train" in ds else next(iter(ds.values()))
        else:
            builder, files = _files(path)
            ds = datasets.load_dataset(builder, data_files=files, split="train")
    except UserError:
        raise
    except Exception as err:  # the file is not what its name says: one line, not a traceback
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"invalid {what}={path_text}: cannot be read ({first[:200]})") from None
    if len(ds) == 0:
        raise UserError(f"invalid {what}={path_text}: the dataset is empty")
    return ds
