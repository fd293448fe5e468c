"""The document model shared by the terminal and the report: sections of paragraphs, tables, figures.

Anything tunebench shows is built once as these objects; `tunebench.console` renders them with
rich, `tunebench.report.render` as Markdown and HTML, so every view says the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    title: str = ""
    show_header: bool = True  # False: a key / value listing

    def add(self, *cells: str) -> None:
        self.rows.append(list(cells))


@dataclass(frozen=True)
class Figure:
    path: Path  # a PNG written into the report folder

    @property
    def alt(self) -> str:
        return self.path.stem


Block = str | Table | Figure  # a str is a paragraph (with **bold** and `code`)


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)

    def add(self, *blocks: Block | None) -> Section:
        """Append the blocks that exist (None is skipped, so optional plots need no if)."""
        self.blocks += [b for b in blocks if b is not None]
        return self
