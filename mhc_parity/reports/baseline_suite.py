"""Refusing to write one selection's rows over the baseline of another, which would drop every case the new rows lack
and let the gate pass their regressions: `overwrite_refusal` (another suite; for a file recording none, lost cases) and
`narrowing_refusal` (fewer paths, lowering or `--impl` within one suite, unless `--allow-narrower`).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from mhc_parity.records.identity import Selection
from mhc_parity.reports.baseline import SUITE_KEY, parse_header, selection_of
from mhc_parity.reports.baseline_load import is_baseline_file, read_first_line

ALLOW_NARROWER = "--allow-narrower"
ELSEWHERE = "write them to another file (--to FILE; with make: BASELINE=FILE on its command line)"


def describe_suite(suite: str | None) -> str:
    if suite is None:
        return "rows that record no suite (their run's manifest was not kept)"
    kind = "suite" if " " not in suite and not suite.startswith("-") else "selection"
    return f"{kind} {suite!r}"


def baseline_cases(path: Path) -> set[str]:
    """The case names in baseline file `path`, read leniently (it is about to be replaced: its digest does not
    matter)."""
    return set(_baseline_rows(path)["case"])


def _baseline_rows(path: Path) -> pd.DataFrame:
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        handle.readline()  # the header line
        pairs = [(row["case"], row.get("candidate") or "") for row in csv.DictReader(handle) if row.get("case")]
    return pd.DataFrame(pairs, columns=["case", "candidate"])


def narrowing_refusal(
    target: Path, selection: Selection, *, elsewhere: str = ELSEWHERE, option: str = ALLOW_NARROWER
) -> str:
    """Why rows covering `selection` must not replace baseline `target` ("" if they may): it covers cases, paths or
    external implementations they lack. `option` lets them through."""
    target = Path(target)
    if not is_baseline_file(target):
        return ""
    old = selection_of(_baseline_rows(target), parse_header(read_first_line(target)) or {})
    lost = selection.uncovered(old)
    dropped = [name for name in old.implementations if name not in selection.implementations]
    if dropped:
        lost.append(f"implementations {', '.join(dropped)}")
    if not lost:
        return ""
    return (
        f"{target} covers more than these rows: {'; '.join(lost)} would be dropped, and the gate would stop "
        f"judging them; refusing to narrow it: {elsewhere}, or pass {option} to replace it"
    )


def overwrite_refusal(target: Path, suite: str | None, cases: Iterable[str], *, elsewhere: str = ELSEWHERE) -> str:
    """Why the rows of `suite` (holding `cases`) must not be written over `target` ("" if they may): it is a baseline
    recording another suite or, recording none, holding cases they lack. Non-baseline targets are left to the writer's
    checks."""
    target = Path(target)
    if not is_baseline_file(target):
        return ""
    recorded = (parse_header(read_first_line(target)) or {}).get(SUITE_KEY)
    if recorded:
        if recorded == suite:
            return ""
        return (
            f"{target} is the baseline of {describe_suite(recorded)}; refusing to write the rows of "
            f"{describe_suite(suite)} over it: {elsewhere}"
        )
    lost = sorted(baseline_cases(target) - set(cases))
    if not lost:
        return ""
    return (
        f"{target} records no suite and holds {len(lost)} case(s) that the rows of {describe_suite(suite)} "
        f"lack (e.g. {lost[0]}); refusing to drop them: {elsewhere}, or delete {target} first"
    )
