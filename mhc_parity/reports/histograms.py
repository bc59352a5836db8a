"""max_rel_err histograms per leaf kind, one figure per dtype: the rows binned (four bins a decade) per leaf kind and
comparison; `histogram_svg` draws them. Zeros and NaN/inf, which a log axis cannot hold, are counted in each panel's
title.
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
    """One leaf kind: counts[comparison][i] rows in bin i; rows measured, and those exactly 0 or not finite (in no
    bin)."""

    kind: str
    counts: dict[str, tuple[int, ...]]
    rows: int
    zeros: int
    nonfinite: int


@dataclasses.dataclass(frozen=True)
class Histogram:
    """One dtype's figure: ascending log-spaced bin edges, the comparisons present and a panel per leaf kind present
    (schema order)."""

    dtype: str
    edges: tuple[float, ...]
    comparisons: tuple[str, ...]
    panels: tuple[Panel, ...]

    @property
    def decades(self) -> tuple[int, int]:
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
    return {dtype: histogram(frame, dtype) for dtype in HISTOGRAM_DTYPES}
