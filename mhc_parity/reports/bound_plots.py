"""Per leaf, a candidate's error next to its bound: the plot a reader of a failing run looks at first.

`bound_panels(frame)` picks the (case, candidate, partner) pairs of the bounded
comparisons (`ERROR_COLUMNS`) with a row that fails or passes at `NEAR_BOUND` or more of
its bound (an error row alone draws nothing: it has no numbers, and the worst-offenders
table lists it): the pairs with a fail or error row first, then the others, each group by
its largest bound usage; at most `MAX_BOUND_PANELS` of them. `bound_panel_svg` draws one
pair with matplotlib (`mhc_parity.reports.plots`): x = its leaves, y (log) = error, per leaf

  a dot     the candidate's error: `cand_oracle_max_err`, against the float64 oracle
            (vs_oracle, vs_reference), or `max_rel_err`, against the partner
            (vs_unsharded, whose bounds read that); red where the leaf fails, orange
            where it passes at NEAR_BOUND or more of its bound, blue otherwise;
  a bar     the bound: that error ÷ `bound_usage`, the error at which the leaf would
            reach its bound (the allowed error itself where the binding criterion reads
            that error), so the gap between dot and bar on the log axis is the bound usage;
  a cross   what the rounding model explains: `oracle_sensitivity_max`, the error one
            rounding of the activation dtype at every operation causes at the leaf;
  a diamond the partner's own error against the oracle (vs_reference: the ratio bounds
            are relative to it).

An error a log axis cannot hold sits on an edge, in its dot's colour: a non-finite one on
the top edge (a triangle up), an exact zero on the bottom edge (a triangle down). A row
with no bound usage, or a usage of 0 (bit-identical to its partner) or infinity, has no
bar. The names of failing leaves are red; an error row's name says "(error)".
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator

from mhc_parity.reports.plots import decade_label, inline_svg
from mhc_parity.reports.summary import FAILING_VERDICTS, UNMEASURED_VERDICTS

# Bound usage from which a passing leaf counts as near its bound: within a factor of 2 (one bit) of failing.
NEAR_BOUND = 0.5
MAX_BOUND_PANELS = 8
# The error a comparison's bounds hold its candidate to (the y axis of its panels).
ERROR_COLUMNS = {
    "vs_oracle": "cand_oracle_max_err",
    "vs_reference": "cand_oracle_max_err",
    "vs_unsharded": "max_rel_err",
}
# The y axis of each error column, in words and its unit: the errors are relative, the
# largest elementwise difference divided by the largest magnitude of the value compared with.
ERROR_AXIS_LABELS = {
    "cand_oracle_max_err": "error against the float64 oracle\n(largest |difference| ÷ largest |oracle|)",
    "max_rel_err": "error against the unsharded run\n(largest |difference| ÷ largest |unsharded|)",
}
assert set(ERROR_AXIS_LABELS) == set(ERROR_COLUMNS.values())
FAILING_COLOUR, NEAR_COLOUR, PASSING_COLOUR, MODEL_COLOUR = "#d62728", "#ff7f0e", "#1f77b4", "#555555"
# Geometry in inches: the width a leaf takes and the smallest figure width; the plot's
# height; a character of a rotated leaf name; the margins (tick labels left, up to three
# rows of legend above).
LEAF_WIDTH, MIN_WIDTH, PLOT_HEIGHT, NAME_WIDTH = 0.3, 4.2, 2.0, 0.05
_LEFT, _RIGHT, _TOP = 0.8, 0.15, 0.6


@dataclasses.dataclass(frozen=True)
class BoundPanel:
    """One (case, candidate, partner) pair of `comparison`: its measured and error rows, in
    frame order, as per-leaf tuples. `errors` are the `error_column` values; `bounds`
    errors ÷ bound_usage (NaN where the usage is 0, infinite or missing); `explained` the
    oracle's sensitivity; `partner_errors` the partner's error against the oracle (NaN
    where the y axis is not the oracle error or the partner is the oracle)."""

    case: str
    candidate: str
    partner: str
    comparison: str
    error_column: str
    leaves: tuple[str, ...]
    verdicts: tuple[str, ...]
    usages: tuple[float, ...]
    errors: tuple[float, ...]
    bounds: tuple[float, ...]
    explained: tuple[float, ...]
    partner_errors: tuple[float, ...]

    @property
    def failing(self) -> int:
        """How many of its rows fail or errored."""
        return sum(verdict in FAILING_VERDICTS for verdict in self.verdicts)

    @property
    def worst_usage(self) -> float:
        """Its largest bound usage (NaN when no row has one)."""
        usages = [u for u in self.usages if not math.isnan(u)]
        return max(usages) if usages else math.nan


def _panel(key: tuple[str, str, str], rows: pd.DataFrame) -> BoundPanel:
    comparison = str(rows["comparison"].iloc[0])
    column = ERROR_COLUMNS[comparison]
    errors = rows[column].to_numpy(dtype=float)
    usages = rows["bound_usage"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        bounds = np.where((usages > 0) & np.isfinite(usages), errors / usages, math.nan)
    partner_errors = rows["partner_oracle_max_err"].to_numpy(dtype=float)
    if column != "cand_oracle_max_err" or key[2] == "oracle":
        partner_errors = np.full(len(rows), math.nan)
    return BoundPanel(
        *key,
        comparison=comparison,
        error_column=column,
        leaves=tuple(rows["leaf"]),
        verdicts=tuple(rows["verdict"]),
        usages=tuple(float(u) for u in usages),
        errors=tuple(float(e) for e in errors),
        bounds=tuple(float(b) for b in bounds),
        explained=tuple(float(s) for s in rows["oracle_sensitivity_max"].to_numpy(dtype=float)),
        partner_errors=tuple(float(p) for p in partner_errors),
    )


def bound_panels(frame: pd.DataFrame, limit: int = MAX_BOUND_PANELS) -> tuple[list[BoundPanel], int]:
    """(the panels to draw, at most `limit`, in the order above; how many pairs qualified)."""
    rows = frame[frame["comparison"].isin(list(ERROR_COLUMNS)) & ~frame["verdict"].isin(UNMEASURED_VERDICTS)]
    if not len(rows):
        return [], 0
    # an error row alone draws nothing (it has no numbers): the worst-offenders table lists it
    flagged = (rows["verdict"] == "fail") | (rows["bound_usage"] >= NEAR_BOUND)
    keys = ["case", "candidate", "partner"]
    chosen = rows[keys][flagged].drop_duplicates()
    panels = [_panel(key, group) for key, group in rows.merge(chosen, on=keys, sort=False).groupby(keys, sort=True)]
    panels.sort(key=_order)  # stable: pairs that tie stay in (case, candidate, partner) order
    return panels[:limit], len(panels)


def _order(panel: BoundPanel) -> tuple[bool, float]:
    """Failing pairs first, then by the largest bound usage, descending (none: last)."""
    usage = panel.worst_usage
    return panel.failing == 0, math.inf if math.isnan(usage) else -usage


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
