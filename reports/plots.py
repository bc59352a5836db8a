"""Plots for the HTML report, rendered off-screen and returned as base64 PNG.

Matplotlib is used through `matplotlib.figure.Figure` directly (the Agg canvas),
never through pyplot, so no global backend or figure state is touched and nothing
opens a window.

Heatmap value rule (one heatmap per comparison kind, rows = case × candidate,
columns = leaf): the cell shows `oracle_ratio_max` (the candidate's max error
against the float64 oracle divided by the partner's) when that ratio is finite.
Where it is undefined — the partner *is* the oracle (vs_oracle rows), or the
partner's oracle error is 0, or nothing was measured — the cell falls back to
`bound_usage` (measured / allowed for the binding tolerance rule) and is marked
with `*`. Cells with no value at all (skip, unsupported, most errors) are grey.
Cells whose row failed or errored get a black frame. Colour is log-scaled around 1.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from reports.schema import COMPARISONS, LEAF_KINDS

from reports.summary import UNMEASURED_VERDICTS
from reports.text import format_number

MAX_HEATMAP_ROWS = 60  # above this, rows are aggregated per case (worst candidate shown)
MAX_ANNOTATED_CELLS = 600
LOG_RANGE = 2.0  # colour saturates at 10**±LOG_RANGE
HISTOGRAM_DTYPES = ("bfloat16", "float32")
DPI = 90


@dataclasses.dataclass(frozen=True)
class Plot:
    """One rendered figure: a title, a caption (plain text) and the PNG as base64."""

    title: str
    caption: str
    png_base64: str
    alt: str


def plain_label(text: str, limit: int = 60) -> str:
    """A label matplotlib prints literally (no mathtext), truncated to `limit` characters."""
    flat = " ".join(str(text).split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return flat.replace("$", r"\$")


def figure_to_base64(figure: Figure) -> str:
    """The figure as a base64-encoded PNG."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def leaf_order(frame: pd.DataFrame) -> list[str]:
    """Leaves ordered by schema leaf kind, then by name."""
    kind_rank = {kind: i for i, kind in enumerate(LEAF_KINDS)}
    pairs = frame[["leaf", "leaf_kind"]].drop_duplicates("leaf")
    return [
        leaf
        for _, leaf in sorted(
            (kind_rank.get(kind, len(LEAF_KINDS)), leaf) for leaf, kind in pairs.itertuples(index=False)
        )
    ]


def heatmap_cell_value(row: pd.Series) -> tuple[float, bool]:
    """(value, used_fallback) for one row under the module's heatmap rule."""
    ratio = float(row["oracle_ratio_max"])
    if math.isfinite(ratio):
        return ratio, False
    usage = float(row["bound_usage"])
    return usage, True  # may be NaN (no value) or inf (saturated)


# Most severe first: the verdict a cell shows when several rows land in it.
VERDICT_SEVERITY = ("error", "fail", "pass", "unsupported", "skip")
VERDICT_ABBREVIATIONS = {"error": "err", "fail": "fail", "pass": "pass", "unsupported": "unsup", "skip": "skip"}


def heatmap_table(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(values, fallback, failing, verdict) pivot tables, rows = label, columns = leaf.

    Several rows landing in one cell (aggregation by case, or several partners)
    keep the largest value; the cell is marked fallback/failing if any row is, and
    shows the most severe verdict.
    """
    cells = frame.copy()
    value_fallback = cells.apply(heatmap_cell_value, axis=1, result_type="expand")
    cells["value"] = value_fallback[0].astype(float) if len(cells) else []
    cells["fallback"] = value_fallback[1].astype(bool) if len(cells) else []
    cells["failing"] = cells["verdict"].isin(("fail", "error"))
    per_candidate = cells[["case", "candidate"]].drop_duplicates()
    if len(per_candidate) > MAX_HEATMAP_ROWS:
        cells["label"] = cells["case"].map(lambda c: plain_label(c, 72) + "  [worst]")
    else:
        cells["label"] = [
            f"{plain_label(case, 72)}  [{plain_label(candidate, 40)}]"
            for case, candidate in zip(cells["case"], cells["candidate"])
        ]
    label_order = list(dict.fromkeys(cells.sort_values(["case", "candidate"], kind="mergesort")["label"]))
    leaves = leaf_order(cells)
    cells["sort_value"] = cells["value"].fillna(-math.inf)
    worst = cells.sort_values("sort_value", ascending=False, kind="mergesort").drop_duplicates(["label", "leaf"])
    values = worst.pivot(index="label", columns="leaf", values="value").reindex(index=label_order, columns=leaves)
    fallback = cells.pivot_table(index="label", columns="leaf", values="fallback", aggfunc="max")
    failing = cells.pivot_table(index="label", columns="leaf", values="failing", aggfunc="max")
    fallback = fallback.reindex(index=label_order, columns=leaves).fillna(False).astype(bool)
    failing = failing.reindex(index=label_order, columns=leaves).fillna(False).astype(bool)
    rank = {v: i for i, v in enumerate(VERDICT_SEVERITY)}
    cells["severity"] = cells["verdict"].map(lambda v: rank.get(v, len(rank)))
    severest = cells.sort_values("severity", kind="mergesort").drop_duplicates(["label", "leaf"])
    verdicts = severest.pivot(index="label", columns="leaf", values="verdict").reindex(index=label_order, columns=leaves)
    return values, fallback, failing, verdicts.fillna("")


def render_heatmap(frame: pd.DataFrame, comparison: str) -> Plot | None:
    """The error-ratio heatmap for one comparison kind, or None when it has no rows."""
    rows = frame[frame["comparison"] == comparison]
    if not len(rows):
        return None
    values, fallback, failing, verdicts = heatmap_table(rows)
    n_rows, n_cols = values.shape
    figure = Figure(figsize=(2.5 + 0.75 * n_cols + 3.5, 1.6 + 0.32 * n_rows))
    axes = figure.add_subplot()
    data = values.to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logged = np.where(data > 0, np.log10(np.where(data > 0, data, 1.0)), -np.inf)
    logged = np.where(np.isnan(data), np.nan, np.clip(logged, -LOG_RANGE, LOG_RANGE))
    colormap = colormaps["RdBu_r"].with_extremes(bad="#d9d9d9")
    image = axes.imshow(
        np.ma.masked_invalid(logged),
        cmap=colormap,
        norm=Normalize(vmin=-LOG_RANGE, vmax=LOG_RANGE),
        aspect="auto",
        interpolation="nearest",
    )
    axes.set_xticks(range(n_cols), [plain_label(c, 30) for c in values.columns], rotation=45, ha="right")
    axes.set_yticks(range(n_rows), list(values.index))
    axes.tick_params(labelsize=8)
    annotate = n_rows * n_cols <= MAX_ANNOTATED_CELLS
    for i in range(n_rows):
        for j in range(n_cols):
            value = data[i, j]
            if failing.iat[i, j]:
                axes.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
            if not annotate:
                continue
            if math.isnan(value):  # no number: say why (its verdict)
                label = VERDICT_ABBREVIATIONS.get(verdicts.iat[i, j], "")
                axes.text(j, i, label, ha="center", va="center", fontsize=7, color="#555555", style="italic")
            else:
                text = format_number(value, 2) + ("*" if fallback.iat[i, j] else "")
                dark = abs(logged[i, j]) > 0.6 * LOG_RANGE
                axes.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    colorbar = figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
    ticks = list(range(-int(LOG_RANGE), int(LOG_RANGE) + 1))
    colorbar.set_ticks(ticks, labels=[f"{10.0 ** t:g}" for t in ticks])
    colorbar.set_label("error ratio (log scale)")
    axes.set_title(f"{comparison}: oracle_ratio_max (* = bound_usage)", fontsize=10)
    caption = (
        f"{comparison}: {n_rows} rows × {n_cols} leaves. Cell = oracle_ratio_max "
        "(candidate's max error vs the float64 oracle ÷ partner's); * = bound_usage where the "
        "ratio is undefined; grey = no value (its verdict is written in the cell); framed = fail or error."
    )
    return Plot(
        title=f"Error ratio — {comparison}",
        caption=caption,
        png_base64=figure_to_base64(figure),
        alt=f"heatmap of error ratio per case and leaf for {comparison}",
    )


def render_heatmaps(frame: pd.DataFrame) -> dict[str, Plot]:
    """One heatmap per comparison kind present (schema order first), keyed by comparison."""
    kinds = set(frame["comparison"])
    ordered = [c for c in COMPARISONS if c in kinds] + sorted(kinds - set(COMPARISONS))
    plots = {comparison: render_heatmap(frame, comparison) for comparison in ordered}
    return {comparison: plot for comparison, plot in plots.items() if plot is not None}


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
    figure = Figure(figsize=(4.2 * columns, 2.9 * grid_rows))
    comparisons = [c for c in COMPARISONS if c in set(rows["comparison"])]
    for index, kind in enumerate(kinds):
        axes = figure.add_subplot(grid_rows, columns, index + 1)
        of_kind = rows[rows["leaf_kind"] == kind]
        bottom = np.zeros(len(edges) - 1)
        for comparison in comparisons:
            values = of_kind.loc[of_kind["comparison"] == comparison, "max_rel_err"].to_numpy(dtype=float)
            counts, _ = np.histogram(values[np.isfinite(values) & (values > 0)], bins=edges)
            if counts.any():
                axes.stairs(bottom + counts, edges, baseline=bottom.copy(), fill=True, label=comparison)
                bottom = bottom + counts
        if bottom.any():
            axes.legend(fontsize=6)
        axes.set_xscale("log")
        kind_errors = of_kind["max_rel_err"].astype(float)
        zeros = int((kind_errors == 0).sum())
        nonfinite = int((~np.isfinite(kind_errors)).sum())
        axes.set_title(f"{kind} (n={len(of_kind)}, zeros={zeros}, nan/inf={nonfinite})", fontsize=8)
        axes.set_xlabel("max_rel_err", fontsize=8)
        axes.tick_params(labelsize=7)
    figure.subplots_adjust(hspace=0.55, wspace=0.25, top=1.0 - 0.45 / (2.9 * grid_rows))
    figure.suptitle(f"max_rel_err per leaf kind — {dtype}", fontsize=10, y=1.0)
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
