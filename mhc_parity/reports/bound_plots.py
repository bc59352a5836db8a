"""Per leaf, a candidate's error next to its bound: the plot a reader of a failing run looks at first.

`bound_panels` picks the (case, candidate, partner) pairs of the bounded comparisons (`ERROR_COLUMNS`) with a row
failing or at `NEAR_BOUND` or more of its bound, failing pairs first, then by largest usage; at most `MAX_BOUND_PANELS`.
Per leaf on a log axis (drawn by `bound_plot_svg`; this module imports no matplotlib):

  dot       the candidate's error (`ERROR_COLUMNS`): red failing, orange near its bound, blue otherwise;
            non-finite on the top edge (triangle up), zero on the bottom edge (triangle down)
  bar       the bound, error ÷ `bound_usage` (none for a usage of 0, infinite or missing)
  cross     what the rounding model explains (`oracle_sensitivity_max`)
  diamond   the partner's error against the oracle (vs_reference bounds are relative to it)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

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
ERROR_AXIS_LABELS = {
    "cand_oracle_max_err": "error against the float64 oracle\n(largest |difference| ÷ largest |oracle|)",
    "max_rel_err": "error against the unsharded run\n(largest |difference| ÷ largest |unsharded|)",
}
assert set(ERROR_AXIS_LABELS) == set(ERROR_COLUMNS.values())


@dataclasses.dataclass(frozen=True)
class BoundPanel:
    """One (case, candidate, partner) pair of `comparison`: its measured and error rows, frame order, per leaf. bounds:
    errors ÷ bound_usage (NaN where it is 0, infinite or missing); partner_errors: NaN where the y axis is not the
    oracle error or the partner is the oracle."""

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
        return sum(verdict in FAILING_VERDICTS for verdict in self.verdicts)

    @property
    def worst_usage(self) -> float:
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
    usage = panel.worst_usage
    return panel.failing == 0, math.inf if math.isnan(usage) else -usage
