"""The report: from records to report.md, a self-contained report.html, PNG plots, CSV and Parquet.

The document is built once as sections (report/sections/, each from its own module) and rendered to
both Markdown and HTML, so the two always say the same thing. Every sentence is computed from the
rows; a section appears only when its data exists.

The folder is a tunebench report's own: a manifest (.tunebench-report.json) lists the files written.
A non-empty folder without one is refused (unless forced), so a user's own files are never overwritten,
and files a previous report wrote but this one does not are removed.
"""

from __future__ import annotations

import json
from pathlib import Path

from tunebench.document import Figure, Section
from tunebench.errors import UserError
from tunebench.files import write_text
from tunebench.record import ResultRecord
from tunebench.report import sections
from tunebench.report.context import ReportContext
from tunebench.report.cost import DEFAULT_JOB_SAMPLES, Offering
from tunebench.report.export import export, write_parquet
from tunebench.report.render import to_html, to_markdown

MANIFEST = ".tunebench-report.json"


def prepare_out(out: Path, force: bool = False) -> None:
    """Refuse a folder that is not ours to write: a file, the root, or a folder holding someone else's files."""
    if out.exists() and not out.is_dir():
        raise UserError(f"invalid out={out}: is a file; give a folder for the report")
    if out.resolve() == Path(out.resolve().anchor):
        raise UserError(f"invalid out={out}: the root folder; give a folder of its own for the report")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file() and not force:
        raise UserError(f"invalid out={out}: the folder holds files that are not a tunebench report; give a new or "
                        "empty folder, or --force to write into it anyway")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"invalid out={out}: cannot be created ({err.strerror or err})") from None


def build(records: list[ResultRecord], out: Path, prices: list[Offering], names: dict[str, str] | None = None,
          job_samples: int = DEFAULT_JOB_SAMPLES) -> list[Section]:
    """The report's sections (plots are written into `out` as they are made)."""
    out.mkdir(parents=True, exist_ok=True)
    return sections.build(ReportContext(records, out, prices, names or {}, job_samples))


def write_report(records: list[ResultRecord], out: Path, prices: list[Offering], title: str,
                 names: dict[str, str] | None = None, job_samples: int = DEFAULT_JOB_SAMPLES,
                 publish: bool = False, force: bool = False) -> list[Path]:
    """Write the report folder; returns the files written (and only those)."""
    prepare_out(out, force)
    secs = build(records, out, prices, names, job_samples)
    written = [b.path for s in secs for b in s.blocks if isinstance(b, Figure)]
    written += [write_text(out / "report.md", to_markdown(title, secs, out)),
                write_text(out / "report.html", to_html(title, secs))]
    export(records, out / "results.csv", "csv")
    write_parquet(records, out / "results.parquet")
    written += [out / "results.csv", out / "results.parquet"]
    if publish:
        from tunebench.report.publish import publish as publish_one

        (out / "publish").mkdir(exist_ok=True)
        written += [publish_one(r, out / "publish", (names or {}).get(r.config_hash)) for r in records
                    if r.kind == "train"]
    _replace_manifest(out, written)
    return written


def _replace_manifest(out: Path, written: list[Path]) -> None:
    """Record what this report wrote; remove what the previous one wrote and this one did not."""
    names = sorted({p.relative_to(out).as_posix() for p in written})
    old = out / MANIFEST
    if old.is_file():
        try:
            previous = json.loads(old.read_text()).get("files", [])
        except (ValueError, AttributeError):
            previous = []
        for stale in set(previous) - set(names):
            if "/" not in stale.replace("publish/", "", 1) and not stale.startswith(".."):
                (out / stale).unlink(missing_ok=True)
    write_text(old, json.dumps({"files": names}, indent=1))
