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
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from mhc_parity.records import dtypes
from mhc_parity.records.gain_rule import gain_floor
from mhc_parity.records.rows import ReportInputError, coerce_row, frame_from_records, is_finite
from mhc_parity.records.schema import IDENTITY_COLUMNS, ROW_COLUMNS, row_key
from mhc_parity.records.text import format_number
from mhc_parity.reports.gain_shift import (
    NO_GAIN_NOTE,
    baseline_gain_note,
    gain_quantile,
    gain_rule_note,
    systematic_note,
)

# The columns the gate needs from each run; a baseline file keeps exactly these.
GATE_COLUMNS = (
    *IDENTITY_COLUMNS,
    "comparison",
    "leaf_kind",
    "dtype",
    "verdict",
    "nan_count",
    "inf_count",
    "cand_oracle_max_err",
    "cand_oracle_rms_err",
    "oracle_sensitivity_max",
    "oracle_sensitivity_rms",
    "cand_oracle_gain",
    "oracle_sensitivity_gain",
)
# The systematic-shift rule's columns: NaN in baselines before format 4, which skips the rule.
GAIN_COLUMNS = ("cand_oracle_gain", "oracle_sensitivity_gain")
# Baselines of format 1 were written before the sensitivity was kept (read as NaN).
SENSITIVITY_COLUMNS = ("oracle_sensitivity_max", "oracle_sensitivity_rms")
LEGACY_GATE_COLUMNS = tuple(c for c in GATE_COLUMNS if c not in SENSITIVITY_COLUMNS + GAIN_COLUMNS)
# Baselines of formats 2 and 3 keep the sensitivity but not the gain.
PRE_GAIN_GATE_COLUMNS = tuple(c for c in GATE_COLUMNS if c not in GAIN_COLUMNS)
# Read from the run (judged under the policy both sides share); baseline files do not keep them.
QUANTILE_COLUMNS = ("oracle_quantile_max", "oracle_quantile_rms")
# The degrees of freedom and draws q_max was computed for: `gain_quantile` reads the stated rate back from them.
RATE_COLUMNS = ("oracle_sensitivity_dof_max", "oracle_draws")
GATE_OPTIONAL_COLUMNS = (
    "reason",
    "bound_usage",
    "cause",
    "cause_id",
    "cause_explained",
    *QUANTILE_COLUMNS,
    *RATE_COLUMNS,
    "oracle_peak_to_l2",
)
GROWTH_METRICS = ("cand_oracle_max_err", "cand_oracle_rms_err")
# The spread of the difference of two independent rounding draws, in units of one draw's.
TWO_RUNS_SPREAD = math.sqrt(2.0)
assert set(GATE_COLUMNS) <= set(ROW_COLUMNS) and set(GATE_OPTIONAL_COLUMNS) <= set(ROW_COLUMNS)

DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_NOISE_FLOOR_ULPS = 2.0

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


def gate_frame(rows: pd.DataFrame | Iterable[Mapping[str, Any]], *, source: str) -> pd.DataFrame:
    """A typed frame with the gate's columns (and the optional ones present).

    Accepts full row sets (`ROW_COLUMNS`) and baseline files (`GATE_COLUMNS`; sensitivity and gain columns may be
    absent: NaN). ReportInputError for a column outside the schema, a missing gate column or duplicate row keys.
    """
    if isinstance(rows, pd.DataFrame):
        records = rows.to_dict(orient="records")
        columns = list(rows.columns)
    else:
        records = [dict(r) for r in rows]
        columns = list(records[0].keys()) if records else list(GATE_COLUMNS)
    unknown = [c for c in columns if c not in ROW_COLUMNS]
    missing = [c for c in LEGACY_GATE_COLUMNS if c not in columns]
    if unknown or missing:
        parts = []
        if missing:
            parts.append(f"missing columns {missing}")
        if unknown:
            parts.append(f"unknown columns {unknown}")
        raise ReportInputError(f"{source}: " + "; ".join(parts))
    kept = list(GATE_COLUMNS) + [c for c in GATE_OPTIONAL_COLUMNS if c in columns]
    coerced = []
    for index, record in enumerate(records):
        record = {**{c: math.nan for c in SENSITIVITY_COLUMNS + GAIN_COLUMNS}, **record}
        absent = [c for c in kept if c not in record]
        if absent:
            raise ReportInputError(f"{source}, row {index}: missing columns {absent}")
        coerced.append(coerce_row(record, f"{source}, row {index}", kept))
    return _unique_keys(frame_from_records(coerced, kept), source)


def typed_gate_frame(frame: pd.DataFrame, *, source: str) -> pd.DataFrame:
    """`gate_frame` of an already typed frame (a canonical row frame or a `Baseline`'s): its gate columns selected, not
    coerced again; the same errors."""
    missing = [c for c in GATE_COLUMNS if c not in frame.columns]
    if missing:
        raise ReportInputError(f"{source}: missing columns {missing}")
    kept = list(GATE_COLUMNS) + [c for c in GATE_OPTIONAL_COLUMNS if c in frame.columns]
    return _unique_keys(frame[kept].reset_index(drop=True), source)


def _unique_keys(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    duplicated = frame.duplicated(list(IDENTITY_COLUMNS), keep=False)
    if duplicated.any():
        first = frame[duplicated].iloc[0]
        raise ReportInputError(f"{source}: {int(duplicated.sum())} rows share a row key, e.g. {row_key(first)}")
    return frame


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


def drift_frame(drifts: Iterable[RowDrift]) -> pd.DataFrame:
    """Drift records as a DataFrame (identity columns first), for tables and CSV."""
    records = []
    for drift in drifts:
        record = dict(zip(IDENTITY_COLUMNS, drift.key))
        record.update({f.name: getattr(drift, f.name) for f in dataclasses.fields(drift) if f.name != "key"})
        records.append(record)
    columns = list(IDENTITY_COLUMNS) + [f.name for f in dataclasses.fields(RowDrift) if f.name != "key"]
    return pd.DataFrame(records, columns=columns)


__all__ = [
    "DEFAULT_GROWTH_FACTOR",
    "DEFAULT_NOISE_FLOOR_ULPS",
    "DTYPE_EPSILON",
    "GAIN_COLUMNS",
    "GATE_COLUMNS",
    "PRE_GAIN_GATE_COLUMNS",
    "QUANTILE_COLUMNS",
    "GROWTH_METRICS",
    "NO_GAIN_NOTE",
    "RowDrift",
    "allowed_error",
    "allowed_gain_shift",
    "baseline_gain_note",
    "compare_row",
    "compare_runs",
    "drift_frame",
    "gain_quantile",
    "gain_rule_note",
    "gate_frame",
    "growth",
    "index_by_key",
    "noise_floor",
    "spread",
    "typed_gate_frame",
]
