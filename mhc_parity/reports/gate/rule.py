"""The PR gate: a current parity run against the baseline, row by row (`row_key`). docs/gate.md has the why.

Failing (`GateResult.ok` False, `mhc-parity gate` exit 1):
  failure        a `fail` or `error` row now;
  missing        a baseline row absent now (grouped per case and path);
  baseline_gap   a current row absent from the baseline, of a case and path it has other rows of;
  lost_coverage  a baseline `pass` row now `skip` or `unsupported`;
  new_nonfinite  nan_count or inf_count > 0 where the baseline row had 0;
  regression     an oracle error past its allowance, or a systematic shift along the leaf
                 (`mhc_parity.reports.gate.drift`); without a gain in the baseline `gain_note` says so.
Informational, never failing:
  improvement    an error shrunk by the same rule, or a fail/error row passing now;
  new_row        a row of a case and a path the baseline has rows of, but not together (a case or path it
                 never ran is refused earlier: `mhc_parity.reports.gate.comparability`).

Both sides are read as gate frames (`gate_frame`: `GATE_COLUMNS`, the columns a baseline file keeps, and the optional
ones present), matched on `row_key`; a matched row's drift is `mhc_parity.reports.gate.drift.compare_row`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from mhc_parity.records.rows import ReportInputError, coerce_row, frame_from_records, unwrap_run
from mhc_parity.records.schema import IDENTITY_COLUMNS, ROW_COLUMNS, row_key
from mhc_parity.records.text import format_number, plural
from mhc_parity.reports.causes import CauseGroup, cause_groups
from mhc_parity.reports.gate.drift import (
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_NOISE_FLOOR_ULPS,
    GAIN_COLUMNS,
    GROWTH_METRICS,
    QUANTILE_COLUMNS,
    RATE_COLUMNS,
    SENSITIVITY_COLUMNS,
    RowDrift,
    compare_runs,
    gain_rule_note,
    index_by_key,
    parameter_problem,
    systematic_note,
)
from mhc_parity.reports.tables import Cell, Table, table_of, text_table

Rows = pd.DataFrame | Iterable[Mapping[str, Any]]

# The columns the gate needs from each run; a baseline file keeps exactly these.
GATE_COLUMNS = (
    *IDENTITY_COLUMNS,
    "comparison",
    "leaf_kind",
    "dtype",
    "verdict",
    "nan_count",
    "inf_count",
    *GROWTH_METRICS,
    *SENSITIVITY_COLUMNS,
    *GAIN_COLUMNS,
)
# Baselines of format 1 were written before the sensitivity was kept, of formats 2 and 3 before the gain.
LEGACY_GATE_COLUMNS = tuple(c for c in GATE_COLUMNS if c not in SENSITIVITY_COLUMNS + GAIN_COLUMNS)
PRE_GAIN_GATE_COLUMNS = tuple(c for c in GATE_COLUMNS if c not in GAIN_COLUMNS)
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
assert set(GATE_COLUMNS) <= set(ROW_COLUMNS) and set(GATE_OPTIONAL_COLUMNS) <= set(ROW_COLUMNS)

# Finding categories, in the order they are printed.
FAILING_CATEGORIES = ("failure", "missing", "baseline_gap", "lost_coverage", "new_nonfinite", "regression")
# Each failing category in words: the finding's noun ("2 regressions"), and the rows' noun with
# what is said of them ("3 rows grew more than ×2").
FINDING_NOUNS = {
    "failure": ("failure", "failures"),
    "missing": ("missing row", "missing rows"),
    "baseline_gap": ("baseline gap", "baseline gaps"),
    "lost_coverage": ("lost coverage", "lost coverage"),
    "new_nonfinite": ("new non-finite", "new non-finite"),
    "regression": ("regression", "regressions"),
}
ROW_COUNT_WORDS = {
    "regression": ("row", "grew more than ×{factor:g} or shifted along the leaf, past the rounding spread"),
    "new_nonfinite": ("row", "with a new NaN/Inf"),
    "lost_coverage": ("passing row", "no longer measured"),
    "missing": ("baseline row", "missing"),
    "baseline_gap": ("row", "the baseline lacks"),
    "failure": ("fail/error row", ""),
}
INFO_CATEGORIES = ("improvement", "new_row")
# A finding's row in every printer's table, after its category where a table names it.
FINDING_COLUMNS = ("case", "candidate", "partner", "leaf", "detail")


@dataclasses.dataclass(frozen=True)
class GateFinding:
    """One reason the gate noticed a row: category, identity, short explanation."""

    category: str
    key: tuple[str, str, str, str]
    detail: str
    comparison: str = ""
    dtype: str = ""
    growth: float = math.nan

    @property
    def case(self) -> str:
        return self.key[0]


@dataclasses.dataclass(frozen=True)
class MissingGroup:
    """Baseline rows absent now, for one case and candidate path ("*": the case has no row now)."""

    case: str
    path: str
    missing: int
    baseline_rows: int


@dataclasses.dataclass(frozen=True)
class GateResult:
    """Everything the gate found, grouped by category; `ok` is False if any failing group is non-empty."""

    failures: tuple[GateFinding, ...]
    missing: tuple[GateFinding, ...]
    baseline_gaps: tuple[GateFinding, ...]
    lost_coverage: tuple[GateFinding, ...]
    new_nonfinite: tuple[GateFinding, ...]
    regressions: tuple[GateFinding, ...]
    improvements: tuple[GateFinding, ...]
    new_rows: tuple[GateFinding, ...]
    drifts: tuple[RowDrift, ...]
    baseline_rows: int
    current_rows: int
    matched_rows: int
    growth_factor: float
    noise_floor_ulps: float
    missing_groups: tuple[MissingGroup, ...] = ()
    # the current run's failing and error rows grouped by cause (`mhc_parity.reports.causes`)
    failure_causes: tuple[CauseGroup, ...] = ()
    # one line when the systematic-shift rule could not be applied (`gain_rule_note`)
    gain_note: str = ""

    @property
    def ok(self) -> bool:
        return not self.failing_findings()

    def by_category(self, category: str) -> tuple[GateFinding, ...]:
        field = {
            "failure": "failures",
            "missing": "missing",
            "baseline_gap": "baseline_gaps",
            "lost_coverage": "lost_coverage",
            "new_nonfinite": "new_nonfinite",
            "regression": "regressions",
            "improvement": "improvements",
            "new_row": "new_rows",
        }[category]
        return getattr(self, field)

    def failing_findings(self) -> tuple[GateFinding, ...]:
        return tuple(f for c in FAILING_CATEGORIES for f in self.by_category(c))

    def counts(self) -> dict[str, int]:
        return {c: len(self.by_category(c)) for c in FAILING_CATEGORIES + INFO_CATEGORIES}

    def summary_line(self) -> str:
        """One line: PASS/FAIL and the counts that matter."""
        counts = self.counts()
        parts = ", ".join(f"{n} {spaced(c)}" for c, n in counts.items() if n)
        verdict = "PASS" if self.ok else "FAIL"
        return (
            f"gate {verdict}: {self.current_rows} current rows vs {self.baseline_rows} baseline rows "
            f"({self.matched_rows} matched; growth factor x{self.growth_factor:g} and the rounding spread, "
            f"noise floor {self.noise_floor_ulps:g} ulps)" + (f": {parts}" if parts else "")
        )

    def table(self, *, max_info_rows: int = 20) -> str:
        """Printable report: the summary line, every failing finding, then the informational lists (cut after
        `max_info_rows` each). Missing rows are counted per case and path, listed only when at most `max_info_rows`."""
        lines = [self.summary_line(), *([self.gain_note] if self.gain_note else [])]
        for category in FAILING_CATEGORIES + INFO_CATEGORIES:
            findings = self.by_category(category)
            if not findings:
                continue
            if category == "missing":  # per case and path; the rows too when they are few
                lines += ["", self.missing_heading() + ":", text_table(self.missing_table())]
                if len(findings) <= max_info_rows:
                    lines += ["", text_table(findings_table(findings))]
                continue
            if category == "failure" and self.failure_causes:  # one heading per cause, its rows under it
                lines += [
                    "",
                    f"failure ({plural(len(findings), 'row')}, from {plural(len(self.failure_causes), 'cause')}):",
                ]
                by_key = {f.key: f for f in findings}
                for group in self.failure_causes:
                    members = [by_key[row_key(r)] for r in group.rows if row_key(r) in by_key]
                    lines += ["", f"  {group.heading()}", text_table(findings_table(members), indent="    ")]
                continue
            limit = None if category in FAILING_CATEGORIES else max_info_rows
            shown = findings if limit is None else findings[:limit]
            lines.append("")
            lines.append(f"{spaced(category)} ({len(findings)}):")
            lines.append(text_table(findings_table(shown)))
            if len(shown) < len(findings):
                lines.append(f"... and {len(findings) - len(shown)} more")
        return "\n".join(lines)

    def missing_heading(self) -> str:
        """e.g. "missing (1516 rows in 3 cases, 24 case/path groups)"."""
        cases = len({g.case for g in self.missing_groups})
        return (
            f"missing ({len(self.missing)} row{'s' * (len(self.missing) != 1)} in {cases} "
            f"case{'s' * (cases != 1)}, {len(self.missing_groups)} case/path "
            f"group{'s' * (len(self.missing_groups) != 1)})"
        )

    def missing_table(self) -> Table:
        """(case, path, "n of m") per missing group; path "(every path)" for a case not run at all."""
        return table_of(
            ("case", "path", "missing rows"),
            (
                (g.case, "(every path)" if g.path == "*" else g.path, f"{g.missing} of {g.baseline_rows}")
                for g in self.missing_groups
            ),
        )


def spaced(category: str) -> str:
    """A finding category in words ("baseline_gap" -> "baseline gap")."""
    return category.replace("_", " ")


def findings_table(findings: Iterable[GateFinding], *, category: Callable[[str], str] | None = None) -> Table:
    """A row per finding (`FINDING_COLUMNS`), led by a "finding" column naming its category as `category` writes it
    (e.g. `spaced`; None: no such column)."""
    headers = (("finding",) if category else ()) + FINDING_COLUMNS
    return table_of(
        headers,
        (
            ((Cell(category(f.category), f"st-{f.category}", span=True),) if category else ()) + (*f.key, f.detail)
            for f in findings
        ),
    )


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


def _reason(row: Mapping[str, Any]) -> str:
    reason = str(row.get("reason", "") or "")
    return f": {reason}" if reason else ""


def _finding(category: str, row: Mapping[str, Any], detail: str, growth: float = math.nan) -> GateFinding:
    return GateFinding(
        category=category,
        key=row_key(row),
        detail=detail,
        comparison=str(row.get("comparison", "")),
        dtype=str(row.get("dtype", "")),
        growth=growth,
    )


def _growth_detail(drift: RowDrift) -> str:
    parts = []
    for label, before, after, factor in (
        ("max", drift.baseline_max, drift.current_max, drift.growth_max),
        ("rms", drift.baseline_rms, drift.current_rms, drift.growth_rms),
    ):
        if not math.isnan(factor):
            parts.append(f"{label} {format_number(before)} -> {format_number(after)} (x{format_number(factor)})")
    return "; ".join(parts)


def _regression_detail(drift: RowDrift, growth_factor: float) -> str:
    grown = any(
        not math.isnan(allowed) and not current <= allowed
        for current, allowed in ((drift.current_max, drift.allowed_max), (drift.current_rms, drift.allowed_rms))
    )
    parts = [f"{_growth_detail(drift)} > allowed x{growth_factor:g} and the rounding spread ({_limits(drift)})"]
    if drift.systematic:
        shift = systematic_note(drift.baseline_gain, drift.current_gain, drift.allowed_gain_shift)
        parts = [shift, *parts] if grown else [shift, _growth_detail(drift)]
    return "; ".join(parts)


def _limits(drift: RowDrift) -> str:
    limits = [(label, value) for label, value in (("max", drift.allowed_max), ("rms", drift.allowed_rms))]
    return "; ".join(f"{label} limit {format_number(value)}" for label, value in limits if not math.isnan(value))


def gate(
    baseline_rows: Rows,
    current_rows: Rows,
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
) -> GateResult:
    """Compare a current run with a baseline under the module docstring's rules. Inputs: full or baseline-column row
    sets (DataFrame, dicts, or a loaded run or baseline). ReportInputError for unusable input (missing columns,
    duplicate keys); ValueError for parameters the gate cannot judge with (`parameter_problem`)."""
    _check_parameters(growth_factor, noise_floor_ulps)
    baseline = gate_frame(unwrap_run(baseline_rows)[0], source="baseline")
    current = gate_frame(unwrap_run(current_rows)[0], source="current run")
    return gate_frames(baseline, current, growth_factor=growth_factor, noise_floor_ulps=noise_floor_ulps)


def _check_parameters(growth_factor: float, noise_floor_ulps: float) -> None:
    problem = parameter_problem(growth_factor, noise_floor_ulps, ("growth_factor", "noise_floor_ulps"))
    if problem:
        raise ValueError(problem)


def gate_frames(
    baseline: pd.DataFrame,
    current: pd.DataFrame,
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
) -> GateResult:
    """`gate` of two gate frames (typed, unique keys), read as they are; the same ValueErrors."""
    _check_parameters(growth_factor, noise_floor_ulps)
    base_rows = index_by_key(baseline)
    cur_rows = index_by_key(current)

    failures = tuple(
        _finding("failure", row, f"{row['verdict']}{_reason(row)}")
        for key, row in sorted(cur_rows.items())
        if row["verdict"] in ("fail", "error")
    )
    missing = tuple(
        _finding("missing", row, f"in the baseline ({row['verdict']}), absent now")
        for key, row in sorted(base_rows.items())
        if key not in cur_rows
    )
    covered = Counter(key[:2] for key in base_rows)  # rows per (case, candidate) in the baseline
    unmatched = [(key, row) for key, row in sorted(cur_rows.items()) if key not in base_rows]
    baseline_gaps = tuple(
        _finding(
            "baseline_gap",
            row,
            f"absent from the baseline, which has {covered[key[:2]]} other rows of "
            f"this case and path ({row['verdict']} now)",
        )
        for key, row in unmatched
        if key[:2] in covered
    )
    new_rows = tuple(
        _finding("new_row", row, f"not in the baseline ({row['verdict']})")
        for key, row in unmatched
        if key[:2] not in covered
    )
    lost_coverage = []
    new_nonfinite = []
    fixed = []
    for key in sorted(base_rows.keys() & cur_rows.keys()):
        before, now = base_rows[key], cur_rows[key]
        if before["verdict"] == "pass" and now["verdict"] in ("skip", "unsupported"):
            lost_coverage.append(_finding("lost_coverage", now, f"pass -> {now['verdict']}{_reason(now)}"))
        grown = [
            f"{column} {before[column]} -> {now[column]}"
            for column in ("nan_count", "inf_count")
            if now[column] > 0 and before[column] == 0
        ]
        if grown:
            new_nonfinite.append(_finding("new_nonfinite", now, "; ".join(grown)))
        if before["verdict"] in ("fail", "error") and now["verdict"] == "pass":
            fixed.append(_finding("improvement", now, f"verdict {before['verdict']} -> pass"))

    drifts = compare_runs(baseline, current, growth_factor=growth_factor, noise_floor_ulps=noise_floor_ulps)
    regressions = tuple(
        _finding(
            "regression",
            cur_rows[d.key],
            _regression_detail(d, growth_factor),
            d.worst_growth,
        )
        for d in drifts
        if d.status == "regression"
    )
    shrunk = [
        _finding("improvement", cur_rows[d.key], _growth_detail(d), d.worst_growth)
        for d in drifts
        if d.status == "improvement"
    ]
    improvements = tuple(sorted(fixed + shrunk, key=lambda f: f.key))
    return GateResult(
        failures=failures,
        missing=missing,
        baseline_gaps=baseline_gaps,
        lost_coverage=tuple(lost_coverage),
        new_nonfinite=tuple(new_nonfinite),
        regressions=tuple(sorted(regressions, key=lambda f: -f.growth)),
        improvements=improvements,
        new_rows=new_rows,
        drifts=drifts,
        baseline_rows=len(baseline),
        current_rows=len(current),
        matched_rows=len(base_rows.keys() & cur_rows.keys()),
        growth_factor=float(growth_factor),
        noise_floor_ulps=float(noise_floor_ulps),
        missing_groups=group_missing(missing, base_rows.keys(), cur_rows.keys()),
        failure_causes=tuple(cause_groups(cur_rows[f.key] for f in failures)),
        gain_note=gain_rule_note(drifts),
    )


def group_missing(
    missing: Sequence[GateFinding], baseline_keys: Iterable[tuple], current_keys: Iterable[tuple]
) -> tuple[MissingGroup, ...]:
    """Missing findings per (case, candidate); one "*" group for a case absent now."""
    per_group = Counter((k[0], k[1]) for k in baseline_keys)
    per_case = Counter(k[0] for k in baseline_keys)
    current_cases = {k[0] for k in current_keys}
    counted = Counter((f.key[0], f.key[1]) for f in missing)
    groups: dict[tuple[str, str], MissingGroup] = {}
    for (case, path), n in sorted(counted.items()):
        if case not in current_cases:
            previous = groups.get((case, "*"))
            groups[(case, "*")] = MissingGroup(case, "*", n + (previous.missing if previous else 0), per_case[case])
        else:
            groups[(case, path)] = MissingGroup(case, path, n, per_group[(case, path)])
    return tuple(groups.values())
