"""One dtype's `Histogram` drawn with matplotlib as inline SVG; only `figure_store` calls it, for a figure not yet
stored.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from mhc_parity.records.schema import COMPARISONS
from mhc_parity.reports.histograms import Histogram
from mhc_parity.reports.plots import RC, decade_label, inline_svg

# One colour per comparison, fixed, so a comparison looks the same in every panel and figure.
COMPARISON_COLOURS = dict(zip(COMPARISONS, ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")))
PANEL_COLUMNS = 3
# Figure geometry in inches: one panel with its title and tick labels, the legend row above the panels.
PANEL_WIDTH, PANEL_HEIGHT = 3.6, 2.0
LEGEND_HEIGHT = 0.3
X_LABEL = "error against the partner (largest |difference| ÷ largest |partner|)"
Y_LABEL = "rows (count)"


def histogram_svg(histogram: Histogram) -> str:
    """A panel per leaf kind in rows of `PANEL_COLUMNS`, one shared log x axis, the comparisons' legend above."""
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
        # Margins in inches for the tick and axis labels, the titles and the legend.
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
