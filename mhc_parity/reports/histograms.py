"""max_rel_err histograms per leaf kind, one figure per dtype: the binned rows each figure draws.

`histogram(frame, dtype)` bins the measured rows of one dtype (log-spaced bins, four per
decade, over the decades the positive errors span) per leaf kind and comparison;
`mhc_parity.reports.histogram_svg.histogram_svg` draws it: one panel per leaf kind, bars stacked by
comparison in a colour that is the same in every panel and figure, a shared log x axis
with a tick per decade, count ticks, and a legend of the comparisons. Exact zeros and
NaN/inf cannot sit on a log axis: each panel's title counts them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from mhc_parity.records.schema import COMPARISONS, LEAF_KINDS
from mhc_parity.reports.summary import UNMEASURED_VERDICTS

HISTOGRAM_DTYPES = ("bfloat16", "float32")
BINS_PER_DECADE = 4


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
