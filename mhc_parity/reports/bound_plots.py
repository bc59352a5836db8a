"""Per leaf, a candidate's error next to its bound: the plot a reader of a failing run looks at first.

`bound_panels(frame)` picks the (case, candidate, partner) pairs of the bounded
comparisons (`ERROR_COLUMNS`) with a row that fails or passes at `NEAR_BOUND` or more of
its bound (an error row alone draws nothing: it has no numbers, and the worst-offenders
table lists it): the pairs with a fail or error row first, then the others, each group by
its largest bound usage; at most `MAX_BOUND_PANELS` of them.
`mhc_parity.reports.bound_plot_svg.bound_panel_svg` draws one pair with matplotlib (this module
imports none: a report whose figures are stored draws nothing): x = its leaves, y (log) = error, per leaf

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
