"""Every matplotlib call of the report: the three drawings (`bound_panel_svg`, `histogram_svg`, `roofline_svg`), each
an inline SVG of a figure's numbers (`mhc_parity.reports.html.figures`), imported only by `figure_svg` on a miss (and
by `bench/speed_run.py`).

`inline_svg` builds a `Figure` on its own SVG canvas (no pyplot state), lets `draw` fill it and returns one `<svg>`
element: no prolog, namespaces or metadata, text as `<text>`, every id prefixed with `prefix` so a page's figures share
none. `RC` holds only while it is built; ids are hashed with a fixed salt, so a run's page is byte-identical each time
it is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from html import escape
from io import StringIO
from typing import TYPE_CHECKING

import numpy as np
from matplotlib import rc_context
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator

from mhc_parity.records.schema import COMPARISONS
from mhc_parity.reports.html.figures import ERROR_COLUMNS, NEAR_BOUND
from mhc_parity.reports.summary import FAILING_VERDICTS

if TYPE_CHECKING:
    from mhc_parity.reports.html.figures import BoundPanel, Histogram
    from mhc_parity.reports.speed import RooflineFigure

RC = {
    "svg.hashsalt": "mhc-parity",  # clip-path and marker ids from a fixed salt, not a fresh uuid4 per save
    "svg.fonttype": "none",  # text stays text: smaller than glyph outlines, selectable, searchable
    "font.size": 8.0,
    "axes.titlesize": 8.0,
    "axes.labelsize": 8.0,
    "xtick.labelsize": 7.0,
    "ytick.labelsize": 7.0,
    "legend.fontsize": 7.0,
    "legend.frameon": False,
    "axes.spines.top": False,  # two lines fewer per panel to draw, and the data reads the same
    "axes.spines.right": False,
}
# What backend_svg writes by default and a reproducible page must not carry.
NO_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_SUPERSCRIPTS = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")
_PROLOG = re.compile(r"\A.*?(?=<svg\b)", re.S)
_NAMESPACES = re.compile(r' xmlns(?::xlink)?="[^"]*"')
# The namespaces `_NAMESPACES` strips, which an SVG file of its own must declare.
_DECLARED_NAMESPACES = 'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"'
_COMMENT = re.compile(r"<!--.*?-->\s*", re.S)
_ID_OR_REFERENCE = re.compile(r'(\bid="|url\(#|href="#)')


def inline_svg(draw: Callable[[Figure], None], size: tuple[float, float], *, prefix: str, label: str) -> str:
    """The figure `draw` fills, `size` (width, height) in inches, as one `<svg class="plot">` element. prefix: letters,
    digits, `-`, unique on the page; label: the accessible name (escaped here)."""
    with rc_context(RC):
        figure = Figure(figsize=size)
        FigureCanvasSVG(figure)
        draw(figure)
        buffer = StringIO()
        figure.savefig(buffer, format="svg", metadata=NO_METADATA)
    svg = _COMMENT.sub("", _NAMESPACES.sub("", _PROLOG.sub("", buffer.getvalue(), count=1)))
    svg = _ID_OR_REFERENCE.sub(lambda match: f"{match.group(1)}{prefix}-", svg)
    return svg.replace("<svg ", f'<svg class="plot" role="img" aria-label="{escape(label, quote=True)}" ', 1).strip()


def standalone_svg(inline: str) -> str:
    """An `inline_svg` element as an .svg file's text, its namespaces declared."""
    return inline.replace("<svg ", f"<svg {_DECLARED_NAMESPACES} ", 1) + "\n"


def decade_label(value: float, _position: object = None) -> str:
    """A log axis tick label as 10 to a Unicode superscript power ("10⁻⁷"), without mathtext's TeX parsing."""
    if not math.isfinite(value) or value <= 0:
        return ""
    power = math.log10(value)
    if abs(power - round(power)) > 1e-9:
        return f"{value:.3g}"
    return "10" + str(round(power)).translate(_SUPERSCRIPTS)


# The bound plot (`BoundPanel`).
ERROR_AXIS_LABELS = {
    "cand_oracle_max_err": "error against the float64 oracle\n(largest |difference| ÷ largest |oracle|)",
    "max_rel_err": "error against the unsharded run\n(largest |difference| ÷ largest |unsharded|)",
}
assert set(ERROR_AXIS_LABELS) == set(ERROR_COLUMNS.values())
FAILING_COLOUR, NEAR_COLOUR, PASSING_COLOUR, MODEL_COLOUR = "#d62728", "#ff7f0e", "#1f77b4", "#555555"
# Geometry in inches (per leaf, minimum width, plot height, per character of a rotated name; margins).
LEAF_WIDTH, MIN_WIDTH, PLOT_HEIGHT, LEAF_NAME_WIDTH = 0.3, 4.2, 2.0, 0.05
_BOUND_LEFT, _BOUND_RIGHT, _BOUND_TOP = 0.8, 0.15, 0.6


def _positive(values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[np.isfinite(values) & (values > 0)]


def bound_panel_svg(panel: BoundPanel, index: int) -> str:
    """The panel as one inline `<svg>` element; `index` (its place on the page) makes its ids unique. Per leaf, on a log
    axis:

      dot       the candidate's error (`ERROR_COLUMNS`): red failing, orange near its bound, blue otherwise;
                non-finite on the top edge (triangle up), zero on the bottom edge (triangle down)
      bar       the bound, error ÷ `bound_usage` (none for a usage of 0, infinite or missing)
      cross     what the rounding model explains (`oracle_sensitivity_max`)
      diamond   the partner's error against the oracle (vs_reference bounds are relative to it)
    """
    count = len(panel.leaves)
    x = np.arange(count)
    errors, bounds = np.asarray(panel.errors), np.asarray(panel.bounds)
    verdicts = np.asarray(panel.verdicts)
    failing = np.isin(verdicts, FAILING_VERDICTS)
    near = ~failing & (np.asarray(panel.usages) >= NEAR_BOUND)
    measured = verdicts != "error"  # an error row has no numbers: only its red name says it is there
    names = [f"{leaf} (error)" if verdict == "error" else leaf for leaf, verdict in zip(panel.leaves, verdicts)]
    width = max(MIN_WIDTH, _BOUND_LEFT + _BOUND_RIGHT + LEAF_WIDTH * count)
    bottom = 0.3 + LEAF_NAME_WIDTH * max(len(name) for name in names)  # the rotated names stand below the axis
    height = PLOT_HEIGHT + bottom + _BOUND_TOP

    def draw(figure: Figure) -> None:
        axes = figure.add_subplot()
        shown = np.concatenate([_positive(a) for a in (errors, bounds, panel.explained, panel.partner_errors)])
        low, high = (shown.min(), shown.max()) if len(shown) else (1e-8, 1.0)
        axes.set_yscale("log")
        axes.set_ylim(10 ** math.floor(math.log10(low) - 0.1), 10 ** math.ceil(math.log10(high) + 0.1))
        axes.set_xlim(-0.6, count - 0.4)
        axes.minorticks_off()  # a tick per decade is enough to read a factor of ten
        axes.yaxis.set_major_locator(LogLocator(numticks=8))
        axes.yaxis.set_major_formatter(FuncFormatter(decade_label))
        axes.grid(axis="y", color="#e6e6e6", linewidth=0.6)
        axes.set_axisbelow(True)
        on_axis = measured & np.isfinite(errors) & (errors > 0)
        joined = on_axis & np.isfinite(bounds)
        axes.vlines(x[joined], errors[joined], bounds[joined], color="#bbbbbb", linewidth=1.0)
        edge = axes.get_xaxis_transform()  # x in data, y in axes fractions: the plot's edges
        places = (  # where a candidate's error is drawn: on the axis, or on an edge when a log axis cannot hold it
            (on_axis, "o", errors, axes.transData),
            (measured & ~np.isfinite(errors), "^", np.ones(count), edge),
            (measured & (errors == 0), "v", np.zeros(count), edge),
        )
        handles = []
        for of_colour, colour, label in (
            (~failing & ~near, PASSING_COLOUR, "candidate's error"),
            (near, NEAR_COLOUR, f"near its bound (>= {NEAR_BOUND:g})"),
            (failing & measured, FAILING_COLOUR, "failing"),
        ):
            for where, marker, values, transform in places:
                chosen = of_colour & where
                if chosen.any():
                    axes.plot(
                        x[chosen],
                        values[chosen],
                        marker,
                        color=colour,
                        markersize=5,
                        transform=transform,
                        clip_on=transform is not edge,
                    )
            if of_colour.any():
                handles.append(Line2D([], [], marker="o", linestyle="", color=colour, label=label))
        for where, marker, label in (
            (places[1][0], "^", "not finite (top edge)"),
            (places[2][0], "v", "0 (bottom edge)"),
        ):
            if where.any():
                handles.append(Line2D([], [], marker=marker, linestyle="", color=MODEL_COLOUR, label=label))
        for values, marker, style, label in (
            (bounds, "_", {"color": "#000000", "markersize": 12, "markeredgewidth": 1.6}, "bound"),
            (np.asarray(panel.explained), "x", {"color": MODEL_COLOUR, "markersize": 5}, "rounding model"),
            (
                np.asarray(panel.partner_errors),
                "D",
                {"color": MODEL_COLOUR, "markersize": 4, "fillstyle": "none"},
                "partner's error",
            ),
        ):
            drawn = np.isfinite(values) & (values > 0)
            if drawn.any():
                axes.plot(x[drawn], values[drawn], marker, linestyle="", **style)
                handles.append(Line2D([], [], marker=marker, linestyle="", label=label, **style))
        axes.set_xticks(x, names, rotation=90)
        for label, fails in zip(axes.get_xticklabels(), failing):
            if fails:
                label.set_color(FAILING_COLOUR)
        axes.set_ylabel(ERROR_AXIS_LABELS[panel.error_column])
        axes.legend(
            handles=handles,
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            ncols=3,
            borderaxespad=0.2,
            columnspacing=1.0,
            handletextpad=0.3,
        )
        figure.subplots_adjust(
            left=_BOUND_LEFT / width,
            right=1 - _BOUND_RIGHT / width,
            bottom=bottom / height,
            top=1 - _BOUND_TOP / height,
        )

    return inline_svg(
        draw,
        (width, height),
        prefix=f"bound-plot-{index}",
        label=f"{ERROR_AXIS_LABELS[panel.error_column].splitlines()[0]} and its bound per leaf: "
        f"{panel.case}, {panel.candidate} vs {panel.partner}",
    )


# The histograms (`Histogram`).
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


# The Speed section's plot (`RooflineFigure`).
# One colour and marker per program, in first-seen order (cycled past ten programs).
PROGRAM_COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
PROGRAM_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "*")
# Geometry in inches: a case's line, the plot's width, the margins (case names left, legend above).
CASE_HEIGHT, ROOFLINE_WIDTH, CASE_NAME_WIDTH = 0.22, 7.5, 0.055
_ROOFLINE_TOP, _ROOFLINE_BOTTOM, LEGEND_ROW = 0.12, 0.55, 0.17
PEAK_COLOUR = "#555555"


def roofline_svg(figure_data: RooflineFigure) -> str:
    cases = list(dict.fromkeys(case for case, _, _ in figure_data.points))
    programs = list(dict.fromkeys(path for _, path, _ in figure_data.points))
    legend_rows = math.ceil(len(programs) / 3)
    left = 0.3 + CASE_NAME_WIDTH * max(len(case) for case in cases)
    height = CASE_HEIGHT * len(cases) + _ROOFLINE_BOTTOM + _ROOFLINE_TOP + LEGEND_ROW * legend_rows
    fractions = np.array([f for _, _, f in figure_data.points], dtype=float)
    positive = fractions[np.isfinite(fractions) & (fractions > 0)]
    low = 10 ** math.floor(math.log10(positive.min() / 1.3)) if len(positive) else 1e-4
    high = max(1.0, 10 ** math.ceil(math.log10(positive.max()))) if len(positive) else 1.0

    def draw(figure: Figure) -> None:
        axes = figure.add_subplot()
        row = {case: index for index, case in enumerate(cases)}
        for index, program in enumerate(programs):
            mine = [(row[c], f) for c, p, f in figure_data.points if p == program and f > 0]
            if mine:
                y, x = zip(*mine)
                axes.plot(
                    x,
                    y,
                    linestyle="none",
                    marker=PROGRAM_MARKERS[index % len(PROGRAM_MARKERS)],
                    markersize=4.5,
                    color=PROGRAM_COLOURS[index % len(PROGRAM_COLOURS)],
                )
        axes.axvline(1.0, color=PEAK_COLOUR, linewidth=0.8, linestyle="--")
        axes.set_xscale("log")
        axes.set_xlim(low, high * 1.3)
        axes.set_ylim(len(cases) - 0.5, -0.5)  # the first case on top, as in the table
        axes.set_yticks(range(len(cases)), cases)
        axes.minorticks_off()
        axes.xaxis.set_major_locator(LogLocator(numticks=9))
        axes.xaxis.set_major_formatter(FuncFormatter(decade_label))
        axes.grid(axis="x", color="#e6e6e6", linewidth=0.6)
        axes.set_axisbelow(True)
        axes.set_xlabel(
            f"fraction of the peak HBM bandwidth of {figure_data.device_kind} "
            f"({figure_data.peak_gb_per_s:.0f} GB/s; dashed: the peak)"
        )
        handles = [
            Line2D(
                [],
                [],
                linestyle="none",
                marker=PROGRAM_MARKERS[i % len(PROGRAM_MARKERS)],
                color=PROGRAM_COLOURS[i % len(PROGRAM_COLOURS)],
                label=program,
            )
            for i, program in enumerate(programs)
        ]
        figure.legend(handles=handles, loc="upper center", ncols=min(3, len(programs)))
        figure.subplots_adjust(
            left=left / ROOFLINE_WIDTH,
            right=1 - 0.2 / ROOFLINE_WIDTH,
            bottom=_ROOFLINE_BOTTOM / height,
            top=1 - (_ROOFLINE_TOP + LEGEND_ROW * legend_rows) / height,
        )

    return inline_svg(
        draw,
        (ROOFLINE_WIDTH, height),
        prefix="roofline",
        label=f"fraction of the peak HBM bandwidth of {figure_data.device_kind} per case and program",
    )
