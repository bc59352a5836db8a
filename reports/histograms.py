"""max_rel_err histograms per leaf kind, one figure per dtype, drawn as inline SVG.

`histogram(frame, dtype)` bins the measured rows of one dtype (log-spaced bins, four per
decade, over the decades the positive errors span) per leaf kind and comparison;
`histogram_svg` draws it: one panel per leaf kind, bars stacked by comparison in a
colour that is the same in every panel, a log x axis with a tick per decade, and the
exact count of every bar on hover. Exact zeros and NaN/inf cannot sit on a log axis:
each panel's title counts them. Plain text, no plotting library (the HTML report stays
one file and draws in a few milliseconds).
"""

from __future__ import annotations

import dataclasses
import math
from html import escape

import numpy as np
import pandas as pd

from records.schema import COMPARISONS, LEAF_KINDS
from reports.summary import UNMEASURED_VERDICTS

HISTOGRAM_DTYPES = ("bfloat16", "float32")
BINS_PER_DECADE = 4
# One colour per comparison, fixed, so a comparison looks the same in every panel and figure.
COMPARISON_COLOURS = dict(zip(COMPARISONS, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")))
PANEL_COLUMNS = 3
# Panel geometry in SVG pixels: the plot area and the margins around it (title above;
# tick labels and the axis label below; count labels left).
_WIDTH, _HEIGHT = 340, 190
_LEFT, _RIGHT, _TOP, _BOTTOM = 42, 12, 26, 38
_LEGEND_HEIGHT = 22


@dataclasses.dataclass(frozen=True)
class Panel:
    """One leaf kind: counts[comparison][i] rows with max_rel_err in bin i; rows measured,
    and how many of them were exactly 0 or not finite (not in any bin)."""

    kind: str
    counts: dict[str, tuple[int, ...]]
    rows: int
    zeros: int
    nonfinite: int


@dataclasses.dataclass(frozen=True)
class Histogram:
    """One dtype's figure: the bin edges (ascending, log-spaced), the comparisons present
    (in `COMPARISONS` order) and a panel per leaf kind present (in `LEAF_KINDS` order)."""

    dtype: str
    edges: tuple[float, ...]
    comparisons: tuple[str, ...]
    panels: tuple[Panel, ...]

    @property
    def decades(self) -> tuple[int, int]:
        """(low, high): the x axis spans 10**low .. 10**high."""
        return round(math.log10(self.edges[0])), round(math.log10(self.edges[-1]))


def histogram(frame: pd.DataFrame, dtype: str) -> Histogram | None:
    """The histogram of `dtype`'s measured rows (not skip/unsupported); None if there are none."""
    rows = frame[(frame["dtype"] == dtype) & ~frame["verdict"].isin(UNMEASURED_VERDICTS)]
    kinds = [k for k in LEAF_KINDS if k in set(rows["leaf_kind"])]
    if not kinds:
        return None
    errors = rows["max_rel_err"].astype(float)
    positive = errors[np.isfinite(errors) & (errors > 0)]
    if len(positive):
        low = math.floor(math.log10(positive.min()))
        high = max(math.ceil(math.log10(positive.max())), low + 1)
    else:
        low, high = -8, 0
    edges = np.logspace(low, high, BINS_PER_DECADE * (high - low) + 1)
    comparisons = tuple(c for c in COMPARISONS if c in set(rows["comparison"]))
    panels = []
    for kind in kinds:
        of_kind = rows[rows["leaf_kind"] == kind]
        kind_errors = of_kind["max_rel_err"].astype(float).to_numpy()
        counts = {}
        for comparison in comparisons:
            values = of_kind.loc[of_kind["comparison"] == comparison, "max_rel_err"].to_numpy(dtype=float)
            binned, _ = np.histogram(values[np.isfinite(values) & (values > 0)], bins=edges)
            counts[comparison] = tuple(int(n) for n in binned)
        panels.append(
            Panel(
                kind,
                counts,
                rows=len(of_kind),
                zeros=int((kind_errors == 0).sum()),
                nonfinite=int((~np.isfinite(kind_errors)).sum()),
            )
        )
    return Histogram(dtype, tuple(float(e) for e in edges), comparisons, tuple(panels))


def histograms(frame: pd.DataFrame) -> dict[str, Histogram | None]:
    """The histogram of each of `HISTOGRAM_DTYPES` (None where it has no measured rows)."""
    return {dtype: histogram(frame, dtype) for dtype in HISTOGRAM_DTYPES}


def _number(value: float) -> str:
    """A coordinate: two decimals, no trailing zeros (keeps the SVG small and stable)."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _count_ticks(top: int) -> list[int]:
    """Up to five round counts from 0 to at least `top`."""
    step = max(1, math.ceil(top / 4))
    magnitude = 10 ** math.floor(math.log10(step))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= step)
    return list(range(0, top + step, step)) if top else [0, 1]


def _panel_svg(histogram: Histogram, panel: Panel, x0: float, y0: float) -> list[str]:
    low, high = histogram.decades
    plot_width, plot_height = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
    left, bottom = x0 + _LEFT, y0 + _HEIGHT - _BOTTOM

    def x_of(value: float) -> float:
        return left + plot_width * (math.log10(value) - low) / (high - low)

    totals = [sum(panel.counts[c][i] for c in histogram.comparisons) for i in range(len(histogram.edges) - 1)]
    ticks = _count_ticks(max(totals))
    y_scale = plot_height / ticks[-1]
    title = f"{panel.kind} (n={panel.rows}, zeros={panel.zeros}, nan/inf={panel.nonfinite})"
    parts = [f'<text class="title" x="{_number(x0 + _WIDTH / 2)}" y="{_number(y0 + 14)}">{escape(title)}</text>']
    for count in ticks:
        y = bottom - count * y_scale
        parts.append(
            f'<line class="grid" x1="{_number(left)}" x2="{_number(left + plot_width)}" '
            f'y1="{_number(y)}" y2="{_number(y)}"/>'
        )
        parts.append(f'<text class="count" x="{_number(left - 4)}" y="{_number(y + 3)}">{count}</text>')
    for decade in range(low, high + 1):
        x = x_of(10.0**decade)
        parts.append(
            f'<line class="axis" x1="{_number(x)}" x2="{_number(x)}" y1="{_number(bottom)}" '
            f'y2="{_number(bottom + 4)}"/>'
        )
        parts.append(f'<text class="decade" x="{_number(x)}" y="{_number(bottom + 15)}">1e{decade}</text>')
    parts.append(
        f'<text class="label" x="{_number(left + plot_width / 2)}" y="{_number(bottom + 30)}">max_rel_err</text>'
    )
    for i, (start, stop) in enumerate(zip(histogram.edges, histogram.edges[1:])):
        stacked = 0
        for comparison in histogram.comparisons:
            count = panel.counts[comparison][i]
            if not count:
                continue
            x, width = x_of(start), x_of(stop) - x_of(start)
            y_top = bottom - (stacked + count) * y_scale
            parts.append(
                f'<rect x="{_number(x)}" y="{_number(y_top)}" width="{_number(width)}" '
                f'height="{_number(count * y_scale)}" fill="{COMPARISON_COLOURS[comparison]}">'
                f"<title>{escape(comparison)}: {count} rows with max_rel_err in "
                f"[{start:.3g}, {stop:.3g})</title></rect>"
            )
            stacked += count
    parts.append(
        f'<line class="axis" x1="{_number(left)}" x2="{_number(left + plot_width)}" '
        f'y1="{_number(bottom)}" y2="{_number(bottom)}"/>'
    )
    return parts


def histogram_svg(histogram: Histogram) -> str:
    """The figure as one `<svg>` element for an HTML page (HTML puts it in the SVG namespace:
    no xmlns, so the page names no URL): a legend row, then the panels in rows of
    `PANEL_COLUMNS`."""
    columns = min(PANEL_COLUMNS, len(histogram.panels))
    grid_rows = math.ceil(len(histogram.panels) / columns)
    width, height = columns * _WIDTH, _LEGEND_HEIGHT + grid_rows * _HEIGHT
    parts = [
        f'<svg class="histogram" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="histogram of max_rel_err per leaf kind for {escape(histogram.dtype)}">'
    ]
    for index, comparison in enumerate(histogram.comparisons):
        x = 12 + index * 120
        parts.append(f'<rect x="{x}" y="6" width="12" height="10" fill="{COMPARISON_COLOURS[comparison]}"/>')
        parts.append(f'<text class="legend" x="{x + 16}" y="15">{escape(comparison)}</text>')
    for index, panel in enumerate(histogram.panels):
        row, column = divmod(index, columns)
        parts.extend(_panel_svg(histogram, panel, column * _WIDTH, _LEGEND_HEIGHT + row * _HEIGHT))
    parts.append("</svg>")
    return "".join(parts)
