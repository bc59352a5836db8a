"""Error-ratio heatmaps: one table per comparison kind, rows = case × candidate, columns = leaf.

A cell shows `oracle_ratio_max` where finite, else `bound_usage`, marked as a fallback (the partner is the oracle or its
error is 0); cells without a value show their verdict. Several rows in one cell (pairs aggregated per case past
`MAX_HEATMAP_ROWS`, several partners) keep the largest value and the most severe verdict. Colour: log10 of the value on
a diverging scale centred on 1, saturating at 10**±LOG_RANGE. The HTML report writes them as tables.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from mhc_parity.records.schema import COMPARISONS, LEAF_KINDS

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
