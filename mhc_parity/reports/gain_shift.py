"""The gate's systematic-shift rule, its quantile and what the gate says when it cannot apply.

A code change that scales a leaf moves the error's component along the leaf (`cand_oracle_gain`)
the same way on every token; host noise moves it within its rounding spread (`S_gain`,
`oracle_sensitivity_gain`). `mhc_parity.reports.drift.compare_row` fails a row whose gain moved
past max(√2·q_gain·S_gain, the noise floor × max|o|/‖o‖₂), whatever its growth (docs/gate.md, "A systematic
shift along the leaf"); this module holds the rule's quantile, its finding in words and its notes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from mhc_parity.records.rate_quantiles import quantile, rate_of
from mhc_parity.records.rows import is_finite
from mhc_parity.records.text import format_number


def systematic_note(baseline_gain: float, current_gain: float, allowed_shift: float) -> str:
    """The systematic-shift finding in words: the gain's move and the largest move allowed."""
    return (
        f"systematic: the error along the leaf moved {format_number(baseline_gain)} -> "
        f"{format_number(current_gain)} (by {format_number(abs(current_gain - baseline_gain))}), "
        f"past the rounding spread {format_number(allowed_shift)}"
    )


def gain_quantile(quantile_max: float, dof_max: float, draws: float) -> float:
    """q_gain: the quantile of the rate q_max was computed at, for one degree of freedom.

    q_max = √F⁻¹(1 − p; dof, draws·dof) (`mhc_parity.records.rate_quantiles.quantile`, with
    dof clamped to >= 1 as there), so p = P(F(dof, draws·dof) > q_max²) reads the policy's stated
    rate back from the row, and q_gain = quantile(p, 1, draws), the q the judging's own gain
    criterion uses. At p = 1e-5 and 16 draws: q_gain = 6.33. A q_max of exactly 1 is a policy
    that states no rate (its bounds take q = 1): q_gain is 1 too. NaN when any input is not
    finite (the rule is then not applied)."""
    if not (is_finite(quantile_max) and is_finite(dof_max) and is_finite(draws)) or draws < 1:
        return math.nan
    if float(quantile_max) == 1.0:
        return 1.0
    rate = rate_of(quantile_max, dof_max, draws)
    if not 0.0 < rate < 1.0:
        return math.nan
    return quantile(rate, 1.0, int(draws))


# What the gate says of a baseline that keeps no gain (`gain_rule_note`, `baseline_gain_note`).
NO_GAIN_NOTE = (
    "note: the systematic-shift rule was not applied: the baseline keeps no oracle gain "
    "(cand_oracle_gain: written before baseline format 4; regenerate it)"
)


def baseline_gain_note(frame: pd.DataFrame) -> str:
    """`NO_GAIN_NOTE` for a baseline gate frame with no finite `cand_oracle_gain` ("" when it
    has some): said once by a reader that gates case by case (the pytest plugin)."""
    gains = frame["cand_oracle_gain"] if "cand_oracle_gain" in frame.columns else ()
    return "" if any(is_finite(g) for g in gains) else NO_GAIN_NOTE


def gain_rule_note(drifts: Iterable) -> str:
    """One line when the systematic-shift rule applied to none of the compared `RowDrift`s ("" when
    it applied to some, or nothing was compared): the baseline keeps no gain (a file written
    before format 4), or no row has the gain's spread."""
    compared = [d for d in drifts if d.status != "not_compared"]
    if not compared or any(not math.isnan(d.allowed_gain_shift) and is_finite(d.baseline_gain) for d in compared):
        return ""
    if not any(is_finite(d.baseline_gain) for d in compared):
        return NO_GAIN_NOTE
    why = "no compared row has the gain's spread (oracle_sensitivity_gain and the run's oracle quantile)"
    return f"note: the systematic-shift rule was not applied: {why}"
