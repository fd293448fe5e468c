"""The report: from records to report.md, a self-contained report.html, PNG plots, CSV and Parquet.

The document is built once as sections (report/sections/, each from its own module) and rendered to
both Markdown and HTML, so the two always say the same thing. Every sentence is computed from the
rows; a section appears only when its data exists.

The folder is a tunebench report's own: a manifest (.tunebench-report.json) lists the files written.
A non-empty folder without one is refused (unless forced), so a user's own files are never overwritten,
and files a previous report wrote but this one does not are removed.
"""

from __future__ import annotations

from pathlib import Path

from tunebench.document import Figure, Section
from tunebench.files import claim_folder, replace_manifest, write_text
from tunebench.record import ResultRecord
from tunebench.report import sections
from tunebench.report.context import ReportContext
from tunebench.report.cost import DEFAULT_JOB_SAMPLES, Offering
from tunebench.report.export import export, write_parquet
from tunebench.report.render import to_html, to_markdown

MANIFEST = ".tunebench-report.json"


def prepare_out(out: Path, force: bool = False) -> None:
    """Refuse a folder that is not ours to write: a file, the root, or a folder holding someone else's files."""
    claim_folder(out, MANIFEST, "report", force)


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
    replace_manifest(out, MANIFEST, written)
    return written
