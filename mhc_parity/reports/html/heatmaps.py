"""Error-ratio heatmaps: one table per comparison kind, rows = case × candidate, columns = leaf.

A cell shows `oracle_ratio_max` where finite, else `bound_usage`, marked as a fallback (the partner is the oracle or its
error is 0); cells without a value show their verdict. Several rows in one cell (pairs aggregated per case past
`MAX_HEATMAP_ROWS`, several partners) keep the largest value and the most severe verdict. Colour: log10 of the value on
a diverging scale centred on 1, saturating at 10**±LOG_RANGE. The page writes them as HTML tables (exact values on
hover), not as figures.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from mhc_parity.records.schema import COMPARISONS, LEAF_KINDS
from mhc_parity.records.text import format_number
from mhc_parity.reports.html.tables import esc

MAX_HEATMAP_ROWS = 60  # above this many case × candidate pairs, rows are aggregated per case
WORST_CANDIDATE = "worst"  # the candidate label of an aggregated row
LOG_RANGE = 2.0  # colour saturates at 10**±LOG_RANGE
NO_VALUE_COLOUR = "#d9d9d9"
# ColorBrewer's 11-class RdBu, blue (low) to red (high): the stops of the colour scale.
_SCALE_STOPS = (
    "#053061",
    "#2166ac",
    "#4393c3",
    "#92c5de",
    "#d1e5f0",
    "#f7f7f7",
    "#fddbc7",
    "#f4a582",
    "#d6604d",
    "#b2182b",
    "#67001f",
)
# Beyond this share of LOG_RANGE from 1 the background is dark enough for white text.
_DARK_FROM = 0.6

# Most severe first: the verdict a cell shows when several rows land in it.
VERDICT_SEVERITY = ("error", "fail", "pass", "unsupported", "skip")
VERDICT_ABBREVIATIONS = {"error": "err", "fail": "fail", "pass": "pass", "unsupported": "unsup", "skip": "skip"}


@dataclasses.dataclass(frozen=True)
class Heatmap:
    """One comparison kind's table. rows: (case, candidate), candidate `WORST_CANDIDATE` when aggregated; leaves:
    columns by leaf kind then name. values (NaN: none), fallback, failing, verdicts: DataFrames by row position and
    leaf."""

    comparison: str
    rows: tuple[tuple[str, str], ...]
    leaves: tuple[str, ...]
    values: pd.DataFrame
    fallback: pd.DataFrame
    failing: pd.DataFrame
    verdicts: pd.DataFrame

    @property
    def aggregated(self) -> bool:
        return any(candidate == WORST_CANDIDATE for _, candidate in self.rows)


def leaf_order(frame: pd.DataFrame) -> list[str]:
    kind_rank = {kind: i for i, kind in enumerate(LEAF_KINDS)}
    pairs = frame[["leaf", "leaf_kind"]].drop_duplicates("leaf")
    return [
        leaf
        for _, leaf in sorted(
            (kind_rank.get(kind, len(LEAF_KINDS)), leaf) for leaf, kind in pairs.itertuples(index=False)
        )
    ]


def cell_values(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(value, used_fallback) per row under the module's value rule."""
    ratio = frame["oracle_ratio_max"].to_numpy(dtype=float)
    usage = frame["bound_usage"].to_numpy(dtype=float)
    finite = np.isfinite(ratio)
    return np.where(finite, ratio, usage), ~finite  # usage may be NaN (no value) or inf (saturated)


# The row columns a heatmap reads: its rows and columns, the cell values, the verdicts.
_CELL_COLUMNS = ["case", "candidate", "leaf", "leaf_kind", "verdict", "oracle_ratio_max", "bound_usage"]


def heatmap(frame: pd.DataFrame, comparison: str) -> Heatmap | None:
    cells = frame.loc[frame["comparison"] == comparison, _CELL_COLUMNS].copy()  # only what a cell is made of
    if not len(cells):
        return None
    cells["value"], cells["fallback"] = cell_values(cells)
    cells["failing"] = cells["verdict"].isin(("fail", "error"))
    if len(cells[["case", "candidate"]].drop_duplicates()) > MAX_HEATMAP_ROWS:
        cells["candidate"] = WORST_CANDIDATE
    ordered = cells.sort_values(["case", "candidate"], kind="mergesort")
    rows = tuple(dict.fromkeys(zip(ordered["case"], ordered["candidate"])))
    position = {row: i for i, row in enumerate(rows)}
    cells["row"] = [position[row] for row in zip(cells["case"], cells["candidate"])]
    leaves = leaf_order(cells)
    cells["sort_value"] = cells["value"].fillna(-math.inf)
    worst = cells.sort_values("sort_value", ascending=False, kind="mergesort").drop_duplicates(["row", "leaf"])
    rank = {v: i for i, v in enumerate(VERDICT_SEVERITY)}
    cells["severity"] = cells["verdict"].map(lambda v: rank.get(v, len(rank)))
    severest = cells.sort_values("severity", kind="mergesort").drop_duplicates(["row", "leaf"])

    def table(source: pd.DataFrame, column: str, aggfunc=None, fill=None) -> pd.DataFrame:
        if aggfunc is None:
            pivot = source.pivot(index="row", columns="leaf", values=column)
        else:
            pivot = source.pivot_table(index="row", columns="leaf", values=column, aggfunc=aggfunc)
        pivot = pivot.reindex(index=range(len(rows)), columns=leaves)
        return pivot if fill is None else pivot.fillna(fill).infer_objects()

    return Heatmap(
        comparison=comparison,
        rows=rows,
        leaves=tuple(leaves),
        values=table(worst, "value").astype(float),
        fallback=table(cells, "fallback", "max", False).astype(bool),
        failing=table(cells, "failing", "max", False).astype(bool),
        verdicts=table(severest, "verdict", fill=""),
    )


def heatmaps(frame: pd.DataFrame) -> dict[str, Heatmap]:
    """One heatmap per comparison kind present (schema order first)."""
    kinds = set(frame["comparison"])
    ordered = [c for c in COMPARISONS if c in kinds] + sorted(kinds - set(COMPARISONS))
    found = {comparison: heatmap(frame, comparison) for comparison in ordered}
    return {comparison: table for comparison, table in found.items() if table is not None}


# The stops as (red, green, blue) rows.
_SCALE_RGB = np.array([[int(stop[i : i + 2], 16) for i in (1, 3, 5)] for stop in _SCALE_STOPS], dtype=float)


def cell_colour(value: float) -> tuple[str, str]:
    if math.isnan(value):
        return NO_VALUE_COLOUR, "#555555"
    position = LOG_RANGE if value == math.inf else -LOG_RANGE if value <= 0 else math.log10(value)
    position = min(max(position, -LOG_RANGE), LOG_RANGE)
    scaled = (position + LOG_RANGE) / (2 * LOG_RANGE) * (len(_SCALE_STOPS) - 1)
    low = min(int(scaled), len(_SCALE_STOPS) - 2)
    mix = _SCALE_RGB[low] * (1 - (scaled - low)) + _SCALE_RGB[low + 1] * (scaled - low)
    background = "#" + "".join(f"{round(channel):02x}" for channel in mix)
    return background, "#ffffff" if abs(position) > _DARK_FROM * LOG_RANGE else "#000000"


def heatmap_legend() -> str:
    """The colour scale of the heatmaps, as swatches from 10**-LOG_RANGE to 10**LOG_RANGE."""
    swatches = []
    for value in [10.0**power for power in range(-int(LOG_RANGE), int(LOG_RANGE) + 1)] + [math.nan]:
        background, text = cell_colour(value)
        label = "no value" if math.isnan(value) else f"{value:g}"
        swatches.append(f'<span class="swatch" style="background:{background};color:{text}">{label}</span>')
    return '<p class="heatmap-legend">Colour (log scale): ' + "".join(swatches) + "</p>"


def heatmap_html(heatmap: Heatmap, anchors: dict[str, str]) -> str:
    """One comparison kind's heatmap table, row labels linking to the cases."""
    head = "<th>case [candidate]</th>" + "".join(
        f'<th class="leaf"><span>{esc(leaf)}</span></th>' for leaf in heatmap.leaves
    )
    body = []
    # Read as arrays, not cell by cell.
    values, verdicts = heatmap.values.to_numpy(dtype=float), heatmap.verdicts.to_numpy()
    failing, fallbacks = heatmap.failing.to_numpy(dtype=bool), heatmap.fallback.to_numpy(dtype=bool)
    for position, (case, candidate) in enumerate(heatmap.rows):
        cells = [f'<td class="row"><a href="#{anchors[case]}">{esc(case)}</a> [{esc(candidate)}]</td>']
        for column, leaf in enumerate(heatmap.leaves):
            value = float(values[position, column])
            verdict = str(verdicts[position, column])
            background, colour = cell_colour(value)
            css = "hm failing" if failing[position, column] else "hm"
            if math.isnan(value):  # no number: say why (its verdict)
                text, css = VERDICT_ABBREVIATIONS.get(verdict, ""), css + " none"
                measured = "no value"
            else:
                fallback = bool(fallbacks[position, column])
                text = format_number(value, 2) + ("*" if fallback else "")
                measured = ("bound_usage " if fallback else "oracle_ratio_max ") + format_number(value)
            title = f"{case} [{candidate}] · {leaf}: {measured} ({verdict or 'no row'})"
            cells.append(
                f'<td class="{css}" style="background:{background};color:{colour}" title="{esc(title)}">'
                f"{esc(text)}</td>"
            )
        body.append("<tr>" + "".join(cells) + "</tr>")
    aggregated = (
        f" More than {MAX_HEATMAP_ROWS} case × candidate pairs: one row per case, its worst candidate."
        if heatmap.aggregated
        else ""
    )
    caption = (
        f"{heatmap.comparison}: {len(heatmap.rows)} rows × {len(heatmap.leaves)} leaves.{aggregated} "
        "Hover a cell for its exact value."
    )
    return (
        f'<figure class="heatmap" id="heatmap-{esc(heatmap.comparison)}"><div class="scroll">'
        f'<table class="heatmap" id="heatmap-table-{esc(heatmap.comparison)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        f"<figcaption><b>Error ratio — {esc(heatmap.comparison)}.</b> {esc(caption)}</figcaption></figure>"
    )


def heatmap_section(tables: dict[str, Heatmap], anchors: dict[str, str]) -> str:
    """All heatmaps, or a note when there is nothing to show."""
    parts = [
        '<section id="heatmaps"><h2>Error ratio per case × leaf</h2>',
        "<p>Each cell is <code>oracle_ratio_max</code>: the candidate's max error against the float64 "
        "oracle divided by the partner's (1 = as accurate as the partner). Where that ratio is "
        "undefined (the partner is the oracle, or the partner's error is 0) the cell shows "
        "<code>bound_usage</code> instead, marked <code>*</code> (1 = exactly at the tolerance). "
        "Grey = no number (the cell names its verdict); a black frame = fail or error.</p>",
    ]
    if not tables:
        parts.append('<p class="empty">No rows to plot.</p>')
    else:
        parts.append(heatmap_legend())
    for heatmap in tables.values():
        parts.append(heatmap_html(heatmap, anchors))
    parts.append("</section>")
    return "\n".join(parts)
