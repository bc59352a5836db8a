"""max_rel_err histograms per leaf kind, one figure per dtype, drawn with matplotlib as inline SVG.

`histogram(frame, dtype)` bins the measured rows of one dtype (log-spaced bins, four per
decade, over the decades the positive errors span) per leaf kind and comparison;
`histogram_svg` draws it (`mhc_parity.reports.plots`): one panel per leaf kind, bars stacked by
comparison in a colour that is the same in every panel and figure, a shared log x axis
with a tick per decade, count ticks, and a legend of the comparisons. Exact zeros and
NaN/inf cannot sit on a log axis: each panel's title counts them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from mhc_parity.records.schema import COMPARISONS, LEAF_KINDS
from mhc_parity.reports.plots import RC, decade_label, inline_svg
from mhc_parity.reports.summary import UNMEASURED_VERDICTS

HISTOGRAM_DTYPES = ("bfloat16", "float32")
BINS_PER_DECADE = 4
# One colour per comparison, fixed, so a comparison looks the same in every panel and figure.
COMPARISON_COLOURS = dict(zip(COMPARISONS, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")))
PANEL_COLUMNS = 3
# Figure geometry in inches: one panel with its title and tick labels, the legend row above the panels.
PANEL_WIDTH, PANEL_HEIGHT = 3.6, 2.0
LEGEND_HEIGHT = 0.3
# The axes in words and their units (max_rel_err is relative: the largest elementwise
# difference divided by the largest magnitude of the partner's value).
X_LABEL = "error against the partner (largest |difference| ÷ largest |partner|)"
Y_LABEL = "rows (count)"


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


def histogram_svg(histogram: Histogram) -> str:
    """The figure as one inline `<svg>` element (`mhc_parity.reports.plots.inline_svg`): a panel per
    leaf kind in rows of `PANEL_COLUMNS`, sharing one log x axis, and a legend of the
    comparisons above them."""
    columns = min(PANEL_COLUMNS, len(histogram.panels))
    grid_rows = math.ceil(len(histogram.panels) / columns)
    width, height = columns * PANEL_WIDTH, grid_rows * PANEL_HEIGHT + LEGEND_HEIGHT
    edges = np.asarray(histogram.edges)

    def draw(figure: Figure) -> None:
        grid = figure.subplots(grid_rows, columns, sharex=True, squeeze=False)
        for index, axes in enumerate(grid.flat):
            if index >= len(histogram.panels):
                axes.remove()
                continue
            panel = histogram.panels[index]
            stacked = np.zeros(len(edges) - 1)
            for comparison in histogram.comparisons:
                counts = np.asarray(panel.counts[comparison])
                bars = [  # each comparison's bars sit on the ones drawn before
                    ((start, low), (start, low + n), (stop, low + n), (stop, low))
                    for start, stop, low, n in zip(edges[:-1], edges[1:], stacked, counts)
                    if n
                ]
                # the limits are set below: no autoscaling pass over the bars' vertices
                axes.add_collection(PolyCollection(bars, color=COMPARISON_COLOURS[comparison]), autolim=False)
                stacked = stacked + counts
            axes.set_xscale("log")
            axes.set_xlim(edges[0], edges[-1])
            axes.set_ylim(0, max(1.0, stacked.max()) * 1.08)
            axes.minorticks_off()  # a tick per decade: each minor tick would be one more artist to lay out and draw
            axes.xaxis.set_major_formatter(FuncFormatter(decade_label))
            axes.xaxis.set_major_locator(LogLocator(numticks=9))  # every decade, or every other past eight
            axes.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
            axes.set_title(f"{panel.kind} (n={panel.rows}, zeros={panel.zeros}, nan/inf={panel.nonfinite})")
            axes.grid(axis="y", color="#e6e6e6", linewidth=0.6)
            axes.set_axisbelow(True)
            if index % columns == 0:
                axes.set_ylabel(Y_LABEL)
            if index + columns >= len(histogram.panels):  # the lowest panel of its column
                axes.xaxis.set_tick_params(labelbottom=True)
        binned = [c for c in histogram.comparisons if any(sum(p.counts[c]) for p in histogram.panels)]
        figure.legend(
            handles=[Patch(color=COMPARISON_COLOURS[c], label=c) for c in binned],
            loc="upper center",
            ncols=max(1, len(binned)),
        )
        # once for every panel (the axis is shared), at the panels' label size (not figure.labelsize)
        figure.supxlabel(X_LABEL, fontsize=RC["axes.labelsize"])
        # Margins in inches: the count labels left, the decades and the x label below, each
        # panel's title above, the legend over the first row.
        figure.subplots_adjust(
            left=0.55 / width,
            right=1 - 0.15 / width,
            bottom=0.55 / height,
            top=1 - (LEGEND_HEIGHT + 0.2) / height,
            hspace=0.75,
            wspace=0.28,
        )

    return inline_svg(
        draw,
        (width, height),
        prefix=f"histogram-{histogram.dtype}",
        label=f"histograms of the error against the partner per leaf kind for {histogram.dtype}",
    )
