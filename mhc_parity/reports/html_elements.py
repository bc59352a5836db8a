"""The HTML report's small pieces: escaping, number cells, tables, verdict spans, case anchors. Text from rows, cases,
errors or metadata goes through `esc`; cells built here take already-escaped HTML.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from mhc_parity.records.text import format_number
from mhc_parity.reports.tables import Cell, Table


def esc(value: Any) -> str:
    """Text escaped for HTML element content and quoted attribute values."""
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A metric for a table cell (`mhc_parity.records.text.format_number`), "—" for NaN (not measured)."""
    return esc(format_number(value, nan="—"))


def case_anchors(cases: Iterable[str]) -> dict[str, str]:
    """A unique, URL-safe element id per case name (position + sanitised slug)."""
    anchors = {}
    for index, case in enumerate(sorted(set(cases))):
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", case).strip("-")[:40]
        anchors[case] = f"case-{index}" + (f"-{slug}" if slug else "")
    return anchors


def case_link(case: str, anchors: dict[str, str]) -> str:
    """A case name linking to its section, or plain text where the page has none (a baseline-only row)."""
    anchor = anchors.get(case)
    return f'<a href="#{esc(anchor)}">{esc(case)}</a>' if anchor else esc(case)


def verdict_span(verdict: str) -> str:
    return f'<span class="v-{esc(verdict)}">{esc(verdict)}</span>'


def table(headers: Sequence[str], body_rows: Iterable[Sequence[str]], *, table_id: str = "") -> str:
    """An HTML table; header texts are escaped here, body cells must already be HTML."""
    id_attr = f' id="{esc(table_id)}"' if table_id else ""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(body) + "</tr>" for body in body_rows)
    return f'<div class="scroll"><table{id_attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def td(content: str, css: str = "") -> str:
    """A table cell around already-escaped HTML."""
    return f'<td class="{css}">{content}</td>' if css else f"<td>{content}</td>"


def num(value: Any) -> str:
    return td(fmt(value), "num")


def html_table(data: Table, *, table_id: str = "", cells: Mapping[str, Callable[[Any], str]] | None = None) -> str:
    """`data` as an HTML `table`: a value through `cells[its column's header]` where given (which returns its `<td>`),
    else a `Cell` with its class, a number through `num`, text escaped."""
    cells = cells or {}

    def cell(header: str, value: Any) -> str:
        if header in cells:
            return cells[header](value)
        if isinstance(value, Cell):
            text = esc(value.text)
            return td(f'<span class="{esc(value.css)}">{text}</span>') if value.span else td(text, value.css)
        return num(value) if isinstance(value, float) else td(esc(value))

    body = ([cell(h, v) for h, v in zip(data.headers, row)] for row in data.rows)
    return table(data.headers, body, table_id=table_id)
