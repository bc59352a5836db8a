"""One `BoundPanel` drawn with matplotlib as inline SVG; only `figure_store` calls it, for a figure not yet stored."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator

from mhc_parity.reports.bound_plots import ERROR_AXIS_LABELS, NEAR_BOUND, BoundPanel
from mhc_parity.reports.plots import decade_label, inline_svg
from mhc_parity.reports.summary import FAILING_VERDICTS

FAILING_COLOUR, NEAR_COLOUR, PASSING_COLOUR, MODEL_COLOUR = "#d62728", "#ff7f0e", "#1f77b4", "#555555"
# Geometry in inches (per leaf, minimum width, plot height, per character of a rotated name; margins).
LEAF_WIDTH, MIN_WIDTH, PLOT_HEIGHT, NAME_WIDTH = 0.3, 4.2, 2.0, 0.05
_LEFT, _RIGHT, _TOP = 0.8, 0.15, 0.6


def _positive(values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[np.isfinite(values) & (values > 0)]


def bound_panel_svg(panel: BoundPanel, index: int) -> str:
    """The panel as one inline `<svg>` element; `index` (its place on the page) makes its ids unique."""
    count = len(panel.leaves)
    x = np.arange(count)
    errors, bounds = np.asarray(panel.errors), np.asarray(panel.bounds)
    verdicts = np.asarray(panel.verdicts)
    failing = np.isin(verdicts, FAILING_VERDICTS)
    near = ~failing & (np.asarray(panel.usages) >= NEAR_BOUND)
    measured = verdicts != "error"  # an error row has no numbers: only its red name says it is there
    names = [f"{leaf} (error)" if verdict == "error" else leaf for leaf, verdict in zip(panel.leaves, verdicts)]
    width = max(MIN_WIDTH, _LEFT + _RIGHT + LEAF_WIDTH * count)
    bottom = 0.3 + NAME_WIDTH * max(len(name) for name in names)  # the rotated names stand below the axis
    height = PLOT_HEIGHT + bottom + _TOP

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
            left=_LEFT / width, right=1 - _RIGHT / width, bottom=bottom / height, top=1 - _TOP / height
        )

    return inline_svg(
        draw,
        (width, height),
        prefix=f"bound-plot-{index}",
        label=f"{ERROR_AXIS_LABELS[panel.error_column].splitlines()[0]} and its bound per leaf: "
        f"{panel.case}, {panel.candidate} vs {panel.partner}",
    )
