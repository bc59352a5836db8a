"""Per-row drift between two runs: growth of the oracle-relative error, with a noise floor.

Two runs are matched row by row on `mhc_parity.records.schema.row_key` (case, candidate,
partner, leaf). For each matched row the *growth* of an oracle-relative error
(`cand_oracle_max_err`, `cand_oracle_rms_err`) is

    growth = max(current, floor) / max(baseline, floor)
    floor  = noise_floor_ulps × eps(dtype)

where eps is the dtype's machine epsilon (the spacing of floats at 1.0:
2^-7 for bfloat16, 2^-10 for float16, 2^-23 for float32, 2^-52 for float64). The
oracle errors are already normalised by the oracle's magnitude, so they are in the
same units as eps. Clamping both sides to the floor means: growth while both errors
stay below the floor is 1 (pure rounding noise, ignored); growth from below the floor
to above it is measured from the floor, never from an accidental near-zero baseline.

For the leaf kinds of `SENSITIVITY_FLOOR` the floor is also at least that multiple of
the leaf's oracle sensitivity (`oracle_sensitivity_max` / `_rms`, the larger of the two
runs'): a gate-scale gradient is one sum over every token and stream with heavy
cancellation, so its error depends on the reduction order by its condition number, and
the order differs between machines. Measured: the same code's float32
large_magnitude d_res_scale error was 0.25x its sensitivity on the machine that made
the first committed baseline and 2.9x on another CPU — the only rows (3 of 1784, all
scale gradients) whose error moved by more than 2x between the two machines.

A row is compared only when both runs measured it (neither verdict is skip,
unsupported or error) and its baseline error is finite. A finite baseline error that
is NaN/inf now counts as infinite growth.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from mhc_parity.records import dtypes
from mhc_parity.records.rows import ReportInputError, coerce_row, frame_from_records, is_finite
from mhc_parity.records.schema import IDENTITY_COLUMNS, ROW_COLUMNS, row_key
from mhc_parity.records.text import format_number

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
)
# Baselines of format 1 were written before the sensitivity was kept (read as NaN).
SENSITIVITY_COLUMNS = ("oracle_sensitivity_max", "oracle_sensitivity_rms")
LEGACY_GATE_COLUMNS = tuple(c for c in GATE_COLUMNS if c not in SENSITIVITY_COLUMNS)
# Leaf kind -> multiple of the oracle sensitivity below which growth is noise (module docstring).
SENSITIVITY_FLOOR = {"scale_grad": 2.0}
# Optional columns used for messages when the run provides them.
GATE_OPTIONAL_COLUMNS = ("reason", "bound_usage", "cause", "cause_id", "cause_explained")
GROWTH_METRICS = ("cand_oracle_max_err", "cand_oracle_rms_err")
assert set(GATE_COLUMNS) <= set(ROW_COLUMNS) and set(GATE_OPTIONAL_COLUMNS) <= set(ROW_COLUMNS)

DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_NOISE_FLOOR_ULPS = 2.0

# Machine epsilon per dtype name and the short spellings people use (`mhc_parity.records.dtypes`).
DTYPE_EPSILON = {name: dtypes.epsilon(name) for name in (*dtypes.FLOAT_DTYPES, *dtypes.ALIASES)}
# Used when a row's dtype is not a float dtype name (should not happen for measured rows).
FALLBACK_EPSILON = DTYPE_EPSILON["float32"]

UNCOMPARED_VERDICTS = ("skip", "unsupported", "error")


def noise_floor(dtype: str, noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS) -> float:
    """The error below which drift is treated as rounding noise for `dtype`."""
    return noise_floor_ulps * DTYPE_EPSILON.get(str(dtype).strip().lower(), FALLBACK_EPSILON)


def growth(baseline: float, current: float, floor: float) -> float:
    """current / baseline with both clamped below at `floor`.

    NaN when the baseline is not finite (nothing to compare against); +inf when the
    baseline is finite and the current value is NaN or infinite.
    """
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
    noise_floor: float  # of cand_oracle_max_err
    noise_floor_rms: float  # of cand_oracle_rms_err
    # "regression" | "improvement" | "steady" | "not_compared"
    status: str
    note: str

    @property
    def worst_growth(self) -> float:
        """The larger of the two growth factors (NaN if neither was compared)."""
        values = [g for g in (self.growth_max, self.growth_rms) if not math.isnan(g)]
        return max(values) if values else math.nan


def gate_frame(rows: pd.DataFrame | Iterable[Mapping[str, Any]], *, source: str) -> pd.DataFrame:
    """A typed frame with the gate's columns (plus reason/bound_usage when present).

    Accepts full row sets (`ROW_COLUMNS`) and baseline files (`GATE_COLUMNS`; the
    sensitivity columns may be absent and are then NaN); any column outside the schema,
    or a missing gate column, raises `ReportInputError`.
    Duplicate row keys raise too: a run must have one row per key.
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
        record = {**{c: math.nan for c in SENSITIVITY_COLUMNS}, **record}
        absent = [c for c in kept if c not in record]
        if absent:
            raise ReportInputError(f"{source}, row {index}: missing columns {absent}")
        coerced.append(coerce_row(record, f"{source}, row {index}", kept))
    return _unique_keys(frame_from_records(coerced, kept), source)


def typed_gate_frame(frame: pd.DataFrame, *, source: str) -> pd.DataFrame:
    """`gate_frame` of a frame whose cells have their schema types already: a canonical row
    frame (`mhc_parity.records.rows.to_frame`, `load_rows`) or a gate frame (a `Baseline`'s). Its gate
    columns are selected, not coerced again; a missing gate column or duplicate row keys
    raise `ReportInputError` as in `gate_frame`."""
    missing = [c for c in GATE_COLUMNS if c not in frame.columns]
    if missing:
        raise ReportInputError(f"{source}: missing columns {missing}")
    kept = list(GATE_COLUMNS) + [c for c in GATE_OPTIONAL_COLUMNS if c in frame.columns]
    return _unique_keys(frame[kept].reset_index(drop=True), source)


def _unique_keys(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """`frame`, or ReportInputError if rows share a row key: a run must have one row per key."""
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
    """The drift of one matched row (see the module docstring for the rule)."""
    floor = noise_floor(current["dtype"] or baseline["dtype"], noise_floor_ulps)
    floor_max, floor_rms = (
        _sensitivity_floor(floor, current["leaf_kind"], baseline.get(column), current.get(column))
        for column in SENSITIVITY_COLUMNS
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
        noise_floor=floor_max,
        noise_floor_rms=floor_rms,
    )
    unmeasured = [v for v in (baseline["verdict"], current["verdict"]) if v in UNCOMPARED_VERDICTS]
    if unmeasured:
        return RowDrift(
            **fields,
            growth_max=math.nan,
            growth_rms=math.nan,
            status="not_compared",
            note=f"verdict {baseline['verdict']} -> {current['verdict']}",
        )
    growth_max = growth(base_max, cur_max, floor_max)
    growth_rms = growth(base_rms, cur_rms, floor_rms)
    compared = [g for g in (growth_max, growth_rms) if not math.isnan(g)]
    if not compared:
        status, note = "not_compared", "no finite oracle error in the baseline"
    elif max(compared) > growth_factor:
        status = "regression"
        note = f"error grew x{format_number(max(compared))} (allowed x{growth_factor:g})"
    elif min(compared) < 1.0 / growth_factor:
        status = "improvement"
        note = f"error shrank x{format_number(min(compared))}"
    else:
        status, note = "steady", ""
    return RowDrift(**fields, growth_max=growth_max, growth_rms=growth_rms, status=status, note=note)


def _sensitivity_floor(floor: float, leaf_kind: str, *sensitivities) -> float:
    """`floor`, raised to SENSITIVITY_FLOOR[leaf_kind] x the larger finite sensitivity."""
    factor = SENSITIVITY_FLOOR.get(str(leaf_kind))
    measured = [float(s) for s in sensitivities if is_finite(s)]
    if factor is None or not measured:
        return floor
    return max(floor, factor * max(measured))


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
    "GATE_COLUMNS",
    "GROWTH_METRICS",
    "RowDrift",
    "compare_row",
    "compare_runs",
    "drift_frame",
    "gate_frame",
    "growth",
    "index_by_key",
    "noise_floor",
    "typed_gate_frame",
]
