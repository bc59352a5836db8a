"""The gate's systematic-shift rule (a gain moved past its spread fails, whatever the growth; `drift.compare_row`,
docs/gate.md): its quantile, its finding in words and the notes for when it cannot apply.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from mhc_parity.records.rate_quantiles import quantile, rate_of
from mhc_parity.records.rows import is_finite
from mhc_parity.records.text import format_number


def systematic_note(baseline_gain: float, current_gain: float, allowed_shift: float) -> str:
    return (
        f"systematic: the error along the leaf moved {format_number(baseline_gain)} -> "
        f"{format_number(current_gain)} (by {format_number(abs(current_gain - baseline_gain))}), "
        f"past the rounding spread {format_number(allowed_shift)}"
    )


def gain_quantile(quantile_max: float, dof_max: float, draws: float) -> float:
    """q_gain: the quantile, for one degree of freedom, of the rate q_max was computed at.

    The rate p = `rate_of(q_max, dof, draws)` is read back from the row; q_gain = quantile(p, 1, draws), the q the
    judging's gain criterion uses (6.33 at p = 1e-5, 16 draws). q_max == 1 (a policy stating no rate) gives 1. NaN when
    an input is not finite (the rule is then not applied).
    """
    if not (is_finite(quantile_max) and is_finite(dof_max) and is_finite(draws)) or draws < 1:
        return math.nan
    if float(quantile_max) == 1.0:
        return 1.0
    rate = rate_of(quantile_max, dof_max, draws)
    if not 0.0 < rate < 1.0:
        return math.nan
    return quantile(rate, 1.0, int(draws))


NO_GAIN_NOTE = (
    "note: the systematic-shift rule was not applied: the baseline keeps no oracle gain "
    "(cand_oracle_gain: written before baseline format 4; regenerate it)"
)


def baseline_gain_note(frame: pd.DataFrame) -> str:
    """`NO_GAIN_NOTE` for a baseline gate frame with no finite `cand_oracle_gain`, else "" (for readers gating case by
    case, which say it once)."""
    gains = frame["cand_oracle_gain"] if "cand_oracle_gain" in frame.columns else ()
    return "" if any(is_finite(g) for g in gains) else NO_GAIN_NOTE


def gain_rule_note(drifts: Iterable) -> str:
    """One line when the rule applied to none of the compared `RowDrift`s (no gain in the baseline, or no gain spread);
    "" when it applied to some or nothing was compared."""
    compared = [d for d in drifts if d.status != "not_compared"]
    if not compared or any(not math.isnan(d.allowed_gain_shift) and is_finite(d.baseline_gain) for d in compared):
        return ""
    if not any(is_finite(d.baseline_gain) for d in compared):
        return NO_GAIN_NOTE
    why = "no compared row has the gain's spread (oracle_sensitivity_gain and the run's oracle quantile)"
    return f"note: the systematic-shift rule was not applied: {why}"
