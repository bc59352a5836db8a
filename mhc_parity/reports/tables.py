"""A report table as data (`Table`: columns and rows), built once by what the table shows, and its plain-text and
Markdown printers; the HTML page's printer is `mhc_parity.reports.html.tables.html_table`. Every Markdown cell goes
through `md_cell`, so a hostile case name can neither break a table nor inject markup.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from mhc_parity.records.text import format_number, format_text_table

MAX_CELL_CHARS = 100


@dataclasses.dataclass(frozen=True)
class Column:
    """A column's header; numeric: its numbers are right-aligned in Markdown; nan: what Markdown and the terminal write
    for a NaN in it (the HTML page writes "—")."""

    header: str
    numeric: bool = False
    nan: str = "nan"


@dataclasses.dataclass(frozen=True)
class Cell:
    """Text the HTML page marks with a CSS class: on the cell ("unmeasured": greyed), or with `span` on a span around
    the text (a finding's category); the other printers write the text."""

    text: str
    css: str
    span: bool = False

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows of cells (text, numbers, `Cell`s) under `columns`."""

    columns: tuple[Column, ...]
    rows: tuple[tuple[Any, ...], ...]

    @property
    def headers(self) -> tuple[str, ...]:
        return tuple(c.header for c in self.columns)

    def head(self, count: int) -> Table:
        return dataclasses.replace(self, rows=self.rows[:count])

    def formatted_rows(self) -> list[list[Any]]:
        """The rows with each number as `format_number` writes it (NaN as its column's `nan`)."""
        return [
            [format_number(v, nan=c.nan) if isinstance(v, float) else v for c, v in zip(self.columns, row)]
            for row in self.rows
        ]


def table_of(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """A table of text columns."""
    return Table(tuple(Column(h) for h in headers), tuple(tuple(row) for row in rows))


def text_table(table: Table, *, indent: str = "") -> str:
    """`table` for the terminal (`format_text_table`)."""
    return format_text_table(table.headers, table.formatted_rows(), indent=indent)


def md_cell(value: Any, limit: int | None = MAX_CELL_CHARS, *, escape_html: bool = True) -> str:
    """Text safe for one GitHub table cell: one line, cut to `limit` (None: never), `|` and backticks escaped, and with
    `escape_html` `&<>` too (trusted text may keep its `<`)."""
    text = " ".join(str(value).split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    escapes = ((("&", "&amp;"), ("<", "&lt;"), (">", "&gt;")) if escape_html else ()) + (("|", "\\|"), ("`", "\\`"))
    for raw, escaped in escapes:
        text = text.replace(raw, escaped)
    return text


def md_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numeric: Sequence[bool] | None = None,
    limit: int | None = MAX_CELL_CHARS,
    escape_html: bool = True,
) -> str:
    """A Markdown table; `numeric[i]` right-aligns column i; cells as `md_cell(limit, escape_html)`."""
    numeric = numeric or [False] * len(headers)

    def cell(value: Any) -> str:
        return md_cell(value, limit, escape_html=escape_html)

    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    lines.extend("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)
    return "\n".join(lines)


def markdown_table(table: Table) -> str:
    """`table` as a GitHub Markdown table (`md_table`)."""
    return md_table(table.headers, table.formatted_rows(), numeric=[c.numeric for c in table.columns])
