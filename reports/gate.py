"""The PR gate: a current parity run against the committed baseline run.

Rules (row identity = `harness.schema.row_key`: case, candidate, partner, leaf):

Failing — any one makes `GateResult.ok` False and `main` exit 1:
  failure        the current run has a `fail` or `error` verdict (any row, new or old);
  missing        a row of the baseline is absent from the current run;
  lost_coverage  a row that passed in the baseline is now `skip` or `unsupported`
                 (it still exists but no longer measures anything);
  new_nonfinite  nan_count or inf_count is > 0 now where the baseline row had 0;
  regression     cand_oracle_max_err or cand_oracle_rms_err grew by more than
                 `growth_factor` (default 2.0), measured above a noise floor of
                 `noise_floor_ulps` (default 2) × eps of the leaf's dtype — see
                 `reports.drift` for the exact formula. Rows that are skip,
                 unsupported or error in either run are not compared.

Informational — listed, never failing:
  improvement    an error shrank by more than `growth_factor`, or a row that was
                 fail/error in the baseline passes now;
  new_row        a row not in the baseline (its verdict still counts above).

The defaults suit bfloat16: with 8 significant bits the normalised max error of a
well-behaved leaf is a few ulps, and re-running on other hardware or another XLA
version moves it by about one ulp; a floor of 2 ulps and a factor of 2 tolerate that
but catch "bfloat16 gradients became 3× worse" even while inside the policy bound.

Missing rows are reported per case and path (a partial run misses whole groups), not
one line per row. `--only-current-cases` gates only the baseline rows of the cases the
current run selected: a deliberately partial run (`--cases ...`) then passes on what it
ran, while every other rule still applies to those cases.

`main` implements `python -m harness gate --baseline B --current C
[--growth-factor F] [--noise-floor-ulps U] [--markdown OUT] [--allow-policy-change]
[--only-current-cases] [--allow-code-change] [--allow-precision-change]`: exit 0 pass,
1 gate failure, 2 usage or input error (unreadable, corrupt, empty or mismatched baseline
or current run — including runs made under another tolerance policy or at another matmul
precision, see `reports.environment`, unless allowed; a current run that did not finish,
or was made by other code than this checkout — see `reports.sources`; an unwritable
--markdown path).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from harness.schema import row_key

from reports.drift import (
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_NOISE_FLOOR_ULPS,
    RowDrift,
    compare_runs,
    gate_frame,
    index_by_key,
)
from reports.environment import precision_conflicts, run_precision
from reports.rows import ReportInputError, format_number, unwrap_run

Rows = pd.DataFrame | Iterable[Mapping[str, Any]]

# Finding categories, in the order they are printed.
FAILING_CATEGORIES = ("failure", "missing", "lost_coverage", "new_nonfinite", "regression")
INFO_CATEGORIES = ("improvement", "new_row")
MAX_TEXT_CELL = 120


@dataclasses.dataclass(frozen=True)
class GateFinding:
    """One reason the gate noticed a row: its category, identity and a short explanation."""

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
    """Baseline rows absent from the current run, for one case and one candidate path.

    path is "*" when the current run has no row of the case at all (every path missing).
    """

    case: str
    path: str
    missing: int
    baseline_rows: int


@dataclasses.dataclass(frozen=True)
class GateResult:
    """Everything the gate found, grouped by category; `ok` is False if any failing group is non-empty."""

    failures: tuple[GateFinding, ...]
    missing: tuple[GateFinding, ...]
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

    @property
    def ok(self) -> bool:
        """True when nothing failing was found."""
        return not self.failing_findings()

    def by_category(self, category: str) -> tuple[GateFinding, ...]:
        """The findings of one category (see FAILING_CATEGORIES and INFO_CATEGORIES)."""
        field = {
            "failure": "failures",
            "missing": "missing",
            "lost_coverage": "lost_coverage",
            "new_nonfinite": "new_nonfinite",
            "regression": "regressions",
            "improvement": "improvements",
            "new_row": "new_rows",
        }[category]
        return getattr(self, field)

    def failing_findings(self) -> tuple[GateFinding, ...]:
        """Every failing finding, grouped in FAILING_CATEGORIES order."""
        return tuple(f for c in FAILING_CATEGORIES for f in self.by_category(c))

    def counts(self) -> dict[str, int]:
        """Findings per category."""
        return {c: len(self.by_category(c)) for c in FAILING_CATEGORIES + INFO_CATEGORIES}

    def summary_line(self) -> str:
        """One line: PASS/FAIL and the counts that matter."""
        counts = self.counts()
        parts = ", ".join(f"{n} {c.replace('_', ' ')}" for c, n in counts.items() if n)
        verdict = "PASS" if self.ok else "FAIL"
        return (
            f"gate {verdict}: {self.current_rows} current rows vs {self.baseline_rows} baseline rows "
            f"({self.matched_rows} matched; growth factor ×{self.growth_factor:g}, "
            f"noise floor {self.noise_floor_ulps:g} ulps)" + (f" — {parts}" if parts else "")
        )

    def table(self, *, max_info_rows: int = 20) -> str:
        """A printable report: the summary line, every failing finding, then the info lists.

        Failing findings are never truncated; improvements and new rows are cut
        after `max_info_rows` each with a count of the rest. Missing rows are counted per
        case and path, and listed one by one only when there are at most `max_info_rows`.
        """
        lines = [self.summary_line()]
        for category in FAILING_CATEGORIES + INFO_CATEGORIES:
            findings = self.by_category(category)
            if not findings:
                continue
            if category == "missing":  # per case and path; the rows too when they are few
                lines += ["", self.missing_heading() + ":", format_text_table(
                    ("case", "path", "missing rows"), self.missing_table_rows()
                )]
                if len(findings) <= max_info_rows:
                    lines += ["", _findings_table(findings)]
                continue
            limit = None if category in FAILING_CATEGORIES else max_info_rows
            shown = findings if limit is None else findings[:limit]
            lines.append("")
            lines.append(f"{category.replace('_', ' ')} ({len(findings)}):")
            lines.append(_findings_table(shown))
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

    def missing_table_rows(self) -> list[tuple[str, str, str]]:
        """(case, path, "n of m") per missing group; path "(every path)" for a case not run at all."""
        return [
            (g.case, "(every path)" if g.path == "*" else g.path, f"{g.missing} of {g.baseline_rows}")
            for g in self.missing_groups
        ]

    def markdown(self, *, max_rows: int = 20) -> str:
        """A Markdown section for a PR comment: status line and one table per non-empty category."""
        from reports.markdown import gate_markdown  # local: markdown imports this module

        return gate_markdown(self, max_rows=max_rows)


def truncate(text: str, limit: int = MAX_TEXT_CELL) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def format_text_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A fixed-width plain-text table (cells flattened to one line and truncated)."""
    cells = [[truncate(str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def _findings_table(findings: Sequence[GateFinding]) -> str:
    return format_text_table(("case", "candidate", "partner", "leaf", "detail"), [(*f.key, f.detail) for f in findings])


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
            parts.append(
                f"{label} {format_number(before)} → {format_number(after)} (×{format_number(factor)})"
            )
    return "; ".join(parts)


def gate(
    baseline_rows: Rows,
    current_rows: Rows,
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
) -> GateResult:
    """Compare a current run with a baseline run under the rules in this module's docstring.

    Both inputs are full row sets or baseline-column row sets (DataFrame, dicts, or
    what `reports.load_run` / `reports.load_baseline` return).
    Raises `ReportInputError` for unusable input (missing columns, duplicate row
    keys) and ValueError for a growth factor <= 1 or a negative noise floor.
    """
    if not growth_factor > 1.0:
        raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
    if not noise_floor_ulps >= 0.0:
        raise ValueError(f"noise_floor_ulps must be >= 0, got {noise_floor_ulps!r}")
    baseline = gate_frame(unwrap_run(baseline_rows)[0], source="baseline")
    current = gate_frame(unwrap_run(current_rows)[0], source="current run")
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
    new_rows = tuple(
        _finding("new_row", row, f"not in the baseline ({row['verdict']})")
        for key, row in sorted(cur_rows.items())
        if key not in base_rows
    )
    lost_coverage = []
    new_nonfinite = []
    fixed = []
    for key in sorted(base_rows.keys() & cur_rows.keys()):
        before, now = base_rows[key], cur_rows[key]
        if before["verdict"] == "pass" and now["verdict"] in ("skip", "unsupported"):
            lost_coverage.append(_finding("lost_coverage", now, f"pass → {now['verdict']}{_reason(now)}"))
        grown = [
            f"{column} {before[column]} → {now[column]}"
            for column in ("nan_count", "inf_count")
            if now[column] > 0 and before[column] == 0
        ]
        if grown:
            new_nonfinite.append(_finding("new_nonfinite", now, "; ".join(grown)))
        if before["verdict"] in ("fail", "error") and now["verdict"] == "pass":
            fixed.append(_finding("improvement", now, f"verdict {before['verdict']} → pass"))

    drifts = compare_runs(
        baseline, current, growth_factor=growth_factor, noise_floor_ulps=noise_floor_ulps
    )
    regressions = tuple(
        _finding(
            "regression",
            cur_rows[d.key],
            f"{_growth_detail(d)} > allowed ×{growth_factor:g}",
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
    )


def group_missing(missing: Sequence[GateFinding], baseline_keys: Iterable[tuple], current_keys: Iterable[tuple]
                  ) -> tuple[MissingGroup, ...]:
    """Missing findings counted per (case, candidate); one "*" group for a case absent from the current run."""
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


# ----------------------------------------------------------------------------- CLI


def build_parser(prog: str = "python -m harness gate") -> argparse.ArgumentParser:
    """The gate's argument parser (shared by `python -m harness gate` and `python -m reports gate`)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Compare a parity run with the committed baseline; exit 0 pass, 1 fail, 2 input error.",
    )
    parser.add_argument("--baseline", required=True, help="baseline CSV (or any run: folder, report.json, rows file)")
    parser.add_argument("--current", required=True, help="run folder, report.json, rows.jsonl or rows.csv")
    parser.add_argument(
        "--growth-factor",
        type=float,
        default=DEFAULT_GROWTH_FACTOR,
        help=f"fail when an oracle-relative error grows by more than this (default {DEFAULT_GROWTH_FACTOR:g})",
    )
    parser.add_argument(
        "--noise-floor-ulps",
        type=float,
        default=DEFAULT_NOISE_FLOOR_ULPS,
        help=f"errors below this many eps of the leaf dtype count as noise (default {DEFAULT_NOISE_FLOOR_ULPS:g})",
    )
    parser.add_argument("--markdown", metavar="OUT", help="also write the result as Markdown to OUT")
    parser.add_argument(
        "--allow-policy-change",
        action="store_true",
        help="compare even if the baseline was produced under a different tolerance policy",
    )
    parser.add_argument(
        "--only-current-cases",
        action="store_true",
        help="gate only the baseline rows of the cases the current run selected (a partial run)",
    )
    parser.add_argument(
        "--allow-code-change",
        action="store_true",
        help="gate a current run even if this checkout's code changed since it was made",
    )
    parser.add_argument(
        "--allow-precision-change",
        action="store_true",
        help="compare even if the baseline ran its matmuls at another precision (or on a backend "
        "where a precision setting means another rounding)",
    )
    return parser


def _fail(message: str) -> int:
    print(f"gate: {message}", file=sys.stderr)
    return 2


def current_cases(current) -> list[str]:
    """The cases the current run selected (its manifest's list, else those with rows)."""
    if current.manifest is not None:
        return list(current.manifest.cases)
    return list(dict.fromkeys(current.frame["case"]))


def _notes(result: GateResult, baseline, current, only_current: bool) -> list[str]:
    """Hints for a gate that found missing rows: a partial run, a seeded run."""
    if not result.missing:
        return []
    notes = []
    ran, known = set(current_cases(current)), set(baseline.frame["case"])
    if not only_current and known - ran:
        notes.append(
            f"note: the current run selected {len(ran & known)} of the baseline's {len(known)} cases; "
            f"--only-current-cases gates just those"
        )
    seed = current.manifest.request.seed if current.manifest is not None else None
    if seed is not None:
        notes.append(
            f"note: the current run used --seed {seed}, which renames every case (<name>-seed{seed}); "
            f"gate it against a baseline made with the same --seed"
        )
    return notes


def _precision_refusal(baseline, current) -> str:
    """The one-line refusal when the runs' matmul precisions conflict, else ""."""
    base, now = run_precision(baseline), run_precision(current)
    try:
        conflicts = precision_conflicts(base, now)
    except ReportInputError as exc:
        return f"cannot compare matmul precisions: {exc}"
    if not conflicts:
        return ""
    where = lambda run: run.metadata.get("backend") or "unrecorded backend"  # noqa: E731
    return (
        f"baseline {baseline.source} ran its matmuls at {base} ({where(baseline)}), the current run "
        f"at {now} ({where(current)}); make a baseline at this precision on this kind of backend "
        "(or pass --allow-precision-change)"
    )


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m harness gate") -> int:
    """Run the gate from the command line; returns the exit code (0 pass, 1 fail, 2 input error)."""
    from harness.outputs import OutputPathError, writable_file
    from reports.sources import load_run  # local: keeps `import reports.gate` light

    parser = build_parser(prog)
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    if not args.growth_factor > 1.0:
        return _fail(f"--growth-factor must be > 1, got {args.growth_factor:g}")
    if not args.noise_floor_ulps >= 0.0:
        return _fail(f"--noise-floor-ulps must be >= 0, got {args.noise_floor_ulps:g}")
    try:
        markdown_path = writable_file(args.markdown) if args.markdown else None
    except OutputPathError as exc:
        return _fail(f"--markdown: {exc}")
    try:
        baseline = load_run(args.baseline)
        current = load_run(args.current, require_current_code=not args.allow_code_change)
    except ReportInputError as exc:
        return _fail(f"cannot read input: {exc}")
    if not len(baseline.frame):
        return _fail(f"baseline {baseline.source} has no rows; regenerate it with `make baseline`")
    if not len(current.frame):
        return _fail(f"current run {current.source} has no rows; did the run write anything?")
    if (
        baseline.policy_hash
        and current.policy_hash
        and baseline.policy_hash != current.policy_hash
        and not args.allow_policy_change
    ):
        return _fail(
            f"baseline {baseline.source} was produced under policy {baseline.policy_hash}, "
            f"the current run under {current.policy_hash}; regenerate the baseline with "
            "`make baseline` (or pass --allow-policy-change)"
        )
    refusal = _precision_refusal(baseline, current)
    if refusal and not args.allow_precision_change:
        return _fail(refusal)
    baseline_frame = baseline.frame
    if args.only_current_cases:
        cases = current_cases(current)
        baseline_frame = baseline_frame[baseline_frame["case"].isin(cases)]
        gated = baseline_frame["case"].nunique()
        if not gated:
            return _fail(f"--only-current-cases: none of the current run's {len(cases)} cases is in the baseline")
        print(f"gating only the current run's cases: {gated} of {baseline.frame['case'].nunique()} baseline cases")
    try:
        result = gate(
            baseline_frame,
            current.frame,
            growth_factor=args.growth_factor,
            noise_floor_ulps=args.noise_floor_ulps,
        )
    except ReportInputError as exc:
        return _fail(f"unusable input: {exc}")
    print(result.table())
    for note in _notes(result, baseline, current, args.only_current_cases):
        print(note)
    if baseline.policy_hash is None or current.policy_hash is None:
        print("(policy hash not recorded on both sides; policy match not checked)")
    if run_precision(baseline) is None or run_precision(current) is None:
        print("(matmul precision not recorded on both sides; precision match not checked)")
    if markdown_path is not None:
        try:
            markdown_path.write_text(result.markdown(), encoding="utf-8")
        except OSError as exc:
            return _fail(f"--markdown: cannot write {markdown_path}: {exc.strerror or exc}")
        print(f"gate: wrote {markdown_path}")
    return 0 if result.ok else 1


__all__ = [
    "DEFAULT_GROWTH_FACTOR",
    "DEFAULT_NOISE_FLOOR_ULPS",
    "GateFinding",
    "GateResult",
    "MissingGroup",
    "build_parser",
    "gate",
    "main",
]
