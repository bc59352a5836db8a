"""The HTML report's histograms, rendered off-screen and returned as base64 PNG.

Matplotlib is used through `matplotlib.figure.Figure` directly (the Agg canvas),
never through pyplot, so no global backend or figure state is touched and nothing
opens a window. (The error-ratio heatmaps are HTML tables: `reports.heatmaps`.)
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from reports.schema import COMPARISONS, LEAF_KINDS

from reports.summary import UNMEASURED_VERDICTS

HISTOGRAM_DTYPES = ("bfloat16", "float32")
DPI = 90


@dataclasses.dataclass(frozen=True)
class Plot:
    """One rendered figure: a title, a caption (plain text) and the PNG as base64."""

    title: str
    caption: str
    png_base64: str
    alt: str


def figure_to_base64(figure: Figure) -> str:
    """The figure as a base64-encoded PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)  # the layout is set by hand: no second draw to trim it
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def render_histogram(frame: pd.DataFrame, dtype: str) -> Plot | None:
    """Histograms of max_rel_err (log x) per leaf kind for one dtype, stacked by comparison."""
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
    edges = np.logspace(low, high, 4 * (high - low) + 1)
    columns = min(3, len(kinds))
    grid_rows = math.ceil(len(kinds) / columns)
    width, height = 4.2 * columns, 2.9 * grid_rows
    figure = Figure(figsize=(width, height))
    comparisons = [c for c in COMPARISONS if c in set(rows["comparison"])]
    for index, kind in enumerate(kinds):
        axes = figure.add_subplot(grid_rows, columns, index + 1)
        of_kind = rows[rows["leaf_kind"] == kind]
        bottom = np.zeros(len(edges) - 1)
        for colour, comparison in enumerate(comparisons):  # one colour per comparison in every panel
            values = of_kind.loc[of_kind["comparison"] == comparison, "max_rel_err"].to_numpy(dtype=float)
            counts, _ = np.histogram(values[np.isfinite(values) & (values > 0)], bins=edges)
            if counts.any():
                axes.stairs(bottom + counts, edges, baseline=bottom.copy(), fill=True, label=comparison,
                            color=f"C{colour}")
                bottom = bottom + counts
        if bottom.any():
            axes.legend(fontsize=6)
        axes.set_xscale("log")
        axes.minorticks_off()  # decades suffice; a log axis's minor ticks were half the drawing time
        kind_errors = of_kind["max_rel_err"].astype(float)
        zeros = int((kind_errors == 0).sum())
        nonfinite = int((~np.isfinite(kind_errors)).sum())
        axes.set_title(f"{kind} (n={len(of_kind)}, zeros={zeros}, nan/inf={nonfinite})", fontsize=8)
        axes.set_xlabel("max_rel_err", fontsize=8)
        axes.tick_params(labelsize=7)
    # Margins in inches: tick labels and the x label below, the count labels left, the
    # figure's and the axes' titles above.
    figure.subplots_adjust(left=0.5 / width, right=1 - 0.15 / width, bottom=0.5 / height, top=1 - 0.6 / height,
                           hspace=0.55, wspace=0.25)
    figure.suptitle(f"max_rel_err per leaf kind — {dtype}", fontsize=10, y=1 - 0.06 / height)
    return Plot(
        title=f"Error histogram — {dtype}",
        caption=(
            f"max_rel_err of measured {dtype} rows, log-scaled bins, stacked by comparison kind. "
            "Exact zeros and NaN/inf values cannot sit on a log axis: they are counted in each title."
        ),
        png_base64=figure_to_base64(figure),
        alt=f"histogram of max_rel_err per leaf kind for {dtype}",
    )


def render_histograms(frame: pd.DataFrame) -> dict[str, Plot | None]:
    """The histogram figure for each of HISTOGRAM_DTYPES (None where there are no rows)."""
    return {dtype: render_histogram(frame, dtype) for dtype in HISTOGRAM_DTYPES}
