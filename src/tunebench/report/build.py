"""The report: from records to report.md, a self-contained report.html, PNG plots, CSV and Parquet.

The document is built once as sections (report/sections/, each from its own module) and rendered to
both Markdown and HTML, so the two always say the same thing. Every sentence is computed from the
rows; a section appears only when its data exists.
"""

from __future__ import annotations

from pathlib import Path

from tunebench.document import Section
from tunebench.files import write_text
from tunebench.record import ResultRecord
from tunebench.report import sections
from tunebench.report.context import ReportContext
from tunebench.report.cost import DEFAULT_JOB_SAMPLES, Offering
from tunebench.report.export import export, write_parquet
from tunebench.report.render import to_html, to_markdown


def build(records: list[ResultRecord], out: Path, prices: list[Offering], names: dict[str, str] | None = None,
          job_samples: int = DEFAULT_JOB_SAMPLES) -> list[Section]:
    """The report's sections (plots are written into `out` as they are made)."""
    out.mkdir(parents=True, exist_ok=True)
    return sections.build(ReportContext(records, out, prices, names or {}, job_samples))


def write_report(records: list[ResultRecord], out: Path, prices: list[Offering], title: str,
                 names: dict[str, str] | None = None, job_samples: int = DEFAULT_JOB_SAMPLES) -> list[Path]:
    secs = build(records, out, prices, names, job_samples)
    write_text(out / "report.md", to_markdown(title, secs, out))
    write_text(out / "report.html", to_html(title, secs))
    export(records, out / "results.csv", "csv")
    write_parquet(records, out / "results.parquet")
    return sorted(out.iterdir())
