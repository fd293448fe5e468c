"""The terminal: document tables rendered with rich, on stdout or stderr.

Only presentation lives here; what a table says is built in tunebench.report (views, analysis).
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

from tunebench.document import Table

NUMBER = re.compile(r"[-+~$±]?[\d.,]+(e[-+]?\d+)?( ?(%|x|GiB|ms|s|h|C|W|MHz|\(!\)))*|-|[0-9a-f]{12,16}")


def rich_table(table: Table):
    """A rich table; columns of figures never wrap or shrink (text columns give way first)."""
    from rich.table import Table as RichTable

    t = RichTable(title=table.title or None, show_header=table.show_header, title_justify="left")
    for i, h in enumerate(table.header):
        cells = [row[i] for row in table.rows if i < len(row)]
        figures = bool(cells) and all(NUMBER.fullmatch(c.strip()) for c in cells)
        t.add_column(h, style="bold" if not table.show_header and i == 0 else None, no_wrap=figures,
                     min_width=max(len(c) for c in cells) if figures else None, overflow="fold")
    for row in table.rows:
        t.add_row(*row)
    return t


def print_table(table: Table, file: TextIO | None = None) -> None:
    """Print a table; piped output is not squeezed into 80 columns."""
    from rich.console import Console

    console = Console(file=file)
    if not console.is_terminal:
        console.width = 200
    console.print(rich_table(table))


def say(line: str) -> None:
    """A status line for the user, on stderr (stdout carries results)."""
    print(line, file=sys.stderr, flush=True)


def warn_skipped(skipped: list[str], where: object) -> None:
    """Say which stored results could not be read (and were left out), one line each, at most ten."""
    if not skipped:
        return
    say(f"tunebench: warning: {len(skipped)} result(s) in {where} could not be read and were left out:")
    for line in skipped[:10]:
        say(f"  {line}")
    if len(skipped) > 10:
        say(f"  ... and {len(skipped) - 10} more")
