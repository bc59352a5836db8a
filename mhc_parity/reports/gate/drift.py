"""Per-row drift between two runs matched on `row_key`: growth of the oracle-relative errors and what they may grow by.
The rules and their derivation: docs/gate.md.

For `cand_oracle_max_err` and `cand_oracle_rms_err` (already relative, so in units of eps):

    floor   = noise_floor_ulps × eps(dtype)
    growth  = max(current, floor) / max(baseline, floor)
    allowed = max(growth_factor × max(baseline, floor),  baseline + √2 × q × S)

S: the larger of the two runs' oracle sensitivities; q: the run's quantile of the policy's stated rate
(`oracle_quantile_*`). Without them the growth factor alone holds. A row regressed when an error exceeds `allowed` (NaN
or inf now always does), improved (listed, never failing) when the rule read the other way holds. It also regressed,
whatever its growth, when its error moved along the leaf:

    |gain_now − gain_then| > max(√2 × q_gain × S_gain,  floor × max|o|/‖o‖₂)

with q_gain the stated rate's quantile for one degree of freedom (`gain_quantile`); not applied without a gain in the
baseline (before format 4). Rows are compared only when both runs measured them (no skip, unsupported or error) and the
baseline error is finite.

The two parameters, `--growth-factor` and `--noise-floor-ulps`, are checked here only (`parameter_problem`: the
command's argparse types, `gate_run` and `gate` itself): an infinite one would switch the growth check off.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from mhc_parity.records import dtypes, rate_quantiles
from mhc_parity.records.gain_rule import gain_floor
from mhc_parity.records.rows import is_finite
from mhc_parity.records.schema import row_key
from mhc_parity.records.text import format_number

# The columns a row's drift reads besides its identity, verdict and dtype. Baselines of format 1 were written before the
# sensitivity was kept, of formats 2 and 3 before the gain (read as NaN, which skips the systematic-shift rule).
GROWTH_METRICS = ("cand_oracle_max_err", "cand_oracle_rms_err")
SENSITIVITY_COLUMNS = ("oracle_sensitivity_max", "oracle_sensitivity_rms")
GAIN_COLUMNS = ("cand_oracle_gain", "oracle_sensitivity_gain")
# Read from the run (judged under the policy both sides share); baseline files do not keep them.
QUANTILE_COLUMNS = ("oracle_quantile_max", "oracle_quantile_rms")
# The degrees of freedom and draws q_max was computed for: `gain_quantile` reads the stated rate back from them.
RATE_COLUMNS = ("oracle_sensitivity_dof_max", "oracle_draws")
# The spread of the difference of two independent rounding draws, in units of one draw's.
TWO_RUNS_SPREAD = math.sqrt(2.0)

DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_NOISE_FLOOR_ULPS = 2.0


def growth_factor_problem(value: float) -> str:
    """Why `value` cannot be the gate's growth factor ("" if it can): finite and above 1."""
    return "" if math.isfinite(value) and value > 1.0 else f"must be a finite number above 1, got {value:g}"


def noise_floor_problem(value: float) -> str:
    """Why `value` cannot be the gate's noise floor in ulps ("" if it can): finite, 0 or more."""
    return "" if math.isfinite(value) and value >= 0.0 else f"must be a finite number, 0 or more, got {value:g}"


# The gate's parameters as `mhc-parity gate` names them (the API passes its keyword names).
PARAMETER_NAMES = ("--growth-factor", "--noise-floor-ulps")


def parameter_problem(growth_factor: float, noise_floor_ulps: float, names: tuple[str, str] = PARAMETER_NAMES) -> str:
    """Why the gate cannot judge with these parameters (one line, naming them as `names`), or ""."""
    for name, problem in zip(names, (growth_factor_problem(growth_factor), noise_floor_problem(noise_floor_ulps))):
        if problem:
            return f"{name} {problem}"
    return ""


def settings_note(growth_factor: float, noise_floor_ulps: float) -> str:
    """One sentence naming the settings that are not the defaults ("" when both are)."""
    changed = [
        f"{label} {shown(value)} (default {shown(default)})"
        for label, value, default, shown in (
            ("growth factor", growth_factor, DEFAULT_GROWTH_FACTOR, lambda v: f"×{format_number(v)}"),
            ("noise floor", noise_floor_ulps, DEFAULT_NOISE_FLOOR_ULPS, lambda v: f"{format_number(v)} ulps"),
        )
        if value != default
    ]
    return f"The gate judged drift with {' and '.join(changed)}, not its defaults." if changed else ""


# Machine epsilon per dtype name and alias.
DTYPE_EPSILON = {name: dtypes.epsilon(name) for name in (*dtypes.FLOAT_DTYPES, *dtypes.ALIASES)}
# Used when a row's dtype is not a float dtype name (should not happen for measured rows).
FALLBACK_EPSILON = DTYPE_EPSILON["float32"]

UNCOMPARED_VERDICTS = ("skip", "unsupported", "error")


def noise_floor(dtype: str, noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS) -> float:
    """The error below which drift is treated as rounding noise for `dtype`."""
    return noise_floor_ulps * DTYPE_EPSILON.get(str(dtype).strip().lower(), FALLBACK_EPSILON)


def spread(sensitivity: float, quantile: float) -> float:
    """√2 × q × S: how far a correct run's error may exceed another's at the stated rate; NaN when either is not finite
    or S is negative."""
    if not (is_finite(sensitivity) and is_finite(quantile)) or sensitivity < 0.0:
        return math.nan
    return TWO_RUNS_SPREAD * float(quantile) * float(sensitivity)


def allowed_error(baseline: float, floor: float, spread_: float, growth_factor: float) -> float:
    """The largest current error that is not a regression: growth_factor × max(baseline, floor), or baseline + spread
    where larger (a NaN spread adds nothing); NaN for a non-finite baseline."""
    if not is_finite(baseline):
        return math.nan
    by_factor = growth_factor * max(float(baseline), floor)
    return by_factor if math.isnan(spread_) else max(by_factor, float(baseline) + spread_)


def growth(baseline: float, current: float, floor: float) -> float:
    """current / baseline with both clamped below at `floor`: NaN for a non-finite baseline, +inf for a finite baseline
    and a NaN or infinite current."""
    if not is_finite(baseline):
        return math.nan
    if not is_finite(current):
        return math.inf
    denominator = max(float(baseline), floor)
    numerator = max(float(current), floor)
    if denominator == 0.0:
        return 1.0 if numerator == 0.0 else math.inf
    return numerator / denominator


@dataclasses.dataclass(frozen=True)
class RowDrift:
    """One matched row's oracle-relative error in both runs and its growth factors."""

    key: tuple[str, str, str, str]
    comparison: str
    leaf_kind: str
    dtype: str
    baseline_verdict: str
    current_verdict: str
    baseline_max: float
    current_max: float
    growth_max: float
    baseline_rms: float
    current_rms: float
    growth_rms: float
    noise_floor: float
    # √2·q·S of each error (NaN: unknown) and the largest current error each may reach (NaN: not compared)
    spread_max: float
    spread_rms: float
    allowed_max: float
    allowed_rms: float
    # "regression" | "improvement" | "steady" | "not_compared"
    status: str
    note: str
    # the signed gain in both runs and how far it may move (NaN: the systematic rule not applied)
    baseline_gain: float = math.nan
    current_gain: float = math.nan
    allowed_gain_shift: float = math.nan
    # True when the gain moved past allowed_gain_shift (a regression whatever the growth)
    systematic: bool = False

    @property
    def gain_shift(self) -> float:
        return abs(self.current_gain - self.baseline_gain)

    @property
    def worst_growth(self) -> float:
        """The larger of the two growth factors (NaN if neither was compared)."""
        values = [g for g in (self.growth_max, self.growth_rms) if not math.isnan(g)]
        return max(values) if values else math.nan


def index_by_key(frame: pd.DataFrame) -> dict[tuple[str, str, str, str], dict]:
    """Row dicts keyed by row identity (the frame must have unique keys)."""
    return {row_key(r): r for r in frame.to_dict(orient="records")}


def compare_row(
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
) -> RowDrift:
    """The drift of one matched row (module docstring)."""
    floor = noise_floor(current["dtype"] or baseline["dtype"], noise_floor_ulps)
    spread_max, spread_rms = (
        spread(_larger(baseline.get(sensitivity), current.get(sensitivity)), _first(current, baseline, quantile))
        for sensitivity, quantile in zip(SENSITIVITY_COLUMNS, QUANTILE_COLUMNS)
    )
    base_max, cur_max = float(baseline["cand_oracle_max_err"]), float(current["cand_oracle_max_err"])
    base_rms, cur_rms = float(baseline["cand_oracle_rms_err"]), float(current["cand_oracle_rms_err"])
    fields = dict(
        key=row_key(current),
        comparison=current["comparison"],
        leaf_kind=current["leaf_kind"],
        dtype=current["dtype"],
        baseline_verdict=baseline["verdict"],
        current_verdict=current["verdict"],
        baseline_max=base_max,
        current_max=cur_max,
        baseline_rms=base_rms,
        current_rms=cur_rms,
        noise_floor=floor,
        spread_max=spread_max,
        spread_rms=spread_rms,
    )
    unmeasured = [v for v in (baseline["verdict"], current["verdict"]) if v in UNCOMPARED_VERDICTS]
    if unmeasured:
        return RowDrift(
            **fields,
            growth_max=math.nan,
            growth_rms=math.nan,
            allowed_max=math.nan,
            allowed_rms=math.nan,
            status="not_compared",
            note=f"verdict {baseline['verdict']} -> {current['verdict']}",
        )
    growth_max = growth(base_max, cur_max, floor)
    growth_rms = growth(base_rms, cur_rms, floor)
    allowed_max = allowed_error(base_max, floor, spread_max, growth_factor)
    allowed_rms = allowed_error(base_rms, floor, spread_rms, growth_factor)
    fields.update(allowed_max=allowed_max, allowed_rms=allowed_rms)
    metrics = (
        ("max", base_max, cur_max, allowed_max, spread_max),
        ("rms", base_rms, cur_rms, allowed_rms, spread_rms),
    )
    # past its allowance (NaN or infinite now: always), or shrunk by the same rule read the other way
    grown = [(label, allowed) for label, _, now, allowed, _ in metrics if _exceeds(now, allowed)]
    shrunk = [
        label
        for label, then, now, allowed, spread_ in metrics
        if not math.isnan(allowed) and is_finite(now) and then > allowed_error(now, floor, spread_, growth_factor)
    ]
    compared = [g for g in (growth_max, growth_rms) if not math.isnan(g)]
    base_gain, cur_gain = _float(baseline.get("cand_oracle_gain")), _float(current.get("cand_oracle_gain"))
    allowed_shift = allowed_gain_shift(
        _larger(baseline.get("oracle_sensitivity_gain"), current.get("oracle_sensitivity_gain")),
        gain_quantile(*(_first(current, baseline, c) for c in ("oracle_quantile_max", *RATE_COLUMNS))),
        gain_floor(floor, _first(current, baseline, "oracle_peak_to_l2")),
    )
    fields.update(baseline_gain=base_gain, current_gain=cur_gain, allowed_gain_shift=allowed_shift)
    shift = abs(cur_gain - base_gain)
    systematic = bool(compared) and is_finite(shift) and not math.isnan(allowed_shift) and shift > allowed_shift
    if not compared:
        status, note = "not_compared", "no finite oracle error in the baseline"
    elif grown or systematic:
        status = "regression"
        notes = []
        if grown:
            notes.append(
                f"error grew x{format_number(max(compared))}, past "
                + "; ".join(f"{label} allowed {format_number(allowed)}" for label, allowed in grown)
            )
        if systematic:
            notes.append(systematic_note(base_gain, cur_gain, allowed_shift))
        note = "; ".join(notes)
    elif shrunk:
        status = "improvement"
        note = f"error shrank x{format_number(min(compared))}"
    else:
        status, note = "steady", ""
    return RowDrift(
        **fields, growth_max=growth_max, growth_rms=growth_rms, status=status, note=note, systematic=systematic
    )


def allowed_gain_shift(sensitivity_gain: float, quantile_gain: float, floor: float) -> float:
    """How far the gain may move between two correct runs: max(√2·q_gain·S_gain, floor), `floor` on the gain's scale
    (`gain_floor`); NaN when the spread is unknown."""
    spread_ = spread(sensitivity_gain, quantile_gain)
    return math.nan if math.isnan(spread_) else max(spread_, floor)


def _float(value: Any) -> float:
    return float(value) if is_finite(value) else math.nan


def _exceeds(current: float, allowed: float) -> bool:
    """Whether `current` is past `allowed` (NaN or infinite always is); False for a NaN `allowed` (nothing to compare
    with)."""
    if math.isnan(allowed):
        return False
    return not (is_finite(current) and current <= allowed)


def _larger(*values) -> float:
    """The largest finite value (NaN if none): a sensitivity either run measured."""
    finite = [float(v) for v in values if is_finite(v)]
    return max(finite) if finite else math.nan


def _first(current: Mapping[str, Any], baseline: Mapping[str, Any], column: str) -> float:
    for row in (current, baseline):
        if is_finite(row.get(column)):
            return float(row[column])
    return math.nan


def compare_runs(
    baseline: pd.DataFrame,
    current: pd.DataFrame,
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
) -> tuple[RowDrift, ...]:
    """Drift for every row present in both gate frames, ordered by row key."""
    base_rows = index_by_key(baseline)
    cur_rows = index_by_key(current)
    return tuple(
        compare_row(
            base_rows[key],
            cur_rows[key],
            growth_factor=growth_factor,
            noise_floor_ulps=noise_floor_ulps,
        )
        for key in sorted(base_rows.keys() & cur_rows.keys())
    )


def systematic_note(baseline_gain: float, current_gain: float, allowed_shift: float) -> str:
    """The systematic-shift rule's finding in words."""
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
    rate = rate_quantiles.rate_of(quantile_max, dof_max, draws)
    if not 0.0 < rate < 1.0:
        return math.nan
    return rate_quantiles.quantile(rate, 1.0, int(draws))


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
