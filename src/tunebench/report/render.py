"""A document (sections of paragraphs, tables and figures) as Markdown and as self-contained HTML."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from tunebench.document import Figure, Section, Table

STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px}"
         "th{background:#eef2f7}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}")


def _md_table(t: Table) -> list[str]:
    lines = [f"**{t.title}**", ""] if t.title else []
    lines += ["| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
    return lines + ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in t.rows] + [""]


def to_markdown(title: str, sections: list[Section], out: Path) -> str:
    lines = [f"# {title}", ""]
    for s in sections:
        lines += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Table):
                lines += _md_table(b)
            elif isinstance(b, Figure):
                lines += [f"![{b.alt}]({b.path.relative_to(out).as_posix()})", ""]
            else:
                lines += [b, ""]
    return "\n".join(lines)


def _inline(text: str) -> str:
    """The little Markdown the paragraphs use (**bold**, `code`), escaped for HTML."""
    t = html.escape(text)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


def _html_table(t: Table) -> list[str]:
    parts = [f"<p><b>{html.escape(t.title)}</b></p>"] if t.title else []
    parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in t.header) + "</tr>")
    parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in t.rows]
    return parts + ["</table>"]


def to_html(title: str, sections: list[Section]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, Table):
                parts += _html_table(b)
            elif isinstance(b, Figure):
                data = base64.b64encode(b.path.read_bytes()).decode()
                parts.append(f"<img alt='{html.escape(b.alt)}' src='data:image/png;base64,{data}'>")
            else:
                parts.append(f"<p>{_inline(b)}</p>")
    # Marks the page once every plot has decoded, so a browser test (or a person) can check it.
    parts.append("<script>window.addEventListener('load',()=>{const im=[...document.images];"
                 "document.body.dataset.images=im.length;document.body.dataset.imagesDecoded="
                 "im.filter(i=>i.complete&&i.naturalWidth>0).length;});</script></body></html>")
    return "\n".join(parts)
