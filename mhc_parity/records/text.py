"""The one number formatter and the one plain-text table: every screen and report cell uses them, so a value reads the
same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

MAX_TEXT_CELL = 120


def format_number(value: Any, digits: int = 3, *, nan: str = "nan") -> str:
    """`digits` significant figures; `nan` for NaN, "inf", "-inf"; text that is not a number comes back unchanged."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(number):
        return nan
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    if number == 0:
        return "0"
    return f"{number:.{digits}g}"


def truncate(text: Any, limit: int | None = MAX_TEXT_CELL) -> str:
    """`text` on one line, cut to `limit` characters (ending in "..." when cut; None: never cut)."""
    flat = " ".join(str(text).split())
    return flat if limit is None or len(flat) <= limit else flat[: limit - 3] + "..."


def format_text_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: str = "", limit: int | None = MAX_TEXT_CELL
) -> str:
    """A fixed-width table: header, dashes, one line per row. Cells flattened and cut to `limit` (None: never); floats
    through `format_number`; every line starts with `indent`."""
    cells = [[truncate(format_number(c) if isinstance(c, float) else c, limit) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]

    def line(values: Sequence[str]) -> str:
        return (indent + "  ".join(v.ljust(w) for v, w in zip(values, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in cells)])


def plural(n: int, word: str) -> str:
    """ "1 row", "3 rows": a count and its noun (an English -s plural)."""
    return f"{n} {word}{'s' * (n != 1)}"
