"""Refusing to write one suite's rows over the baseline of another.

A baseline holds the rows of one selection of cases (`mhc_parity.records.run_suite`: a suite,
perhaps narrowed). Writing another selection's rows over it (`make baseline SUITE=smoke` with
the default suite's file as its target) drops every case the new rows lack: the gate then
reads their regressions as rows the baseline does not hold, and passes. `mhc-parity baseline`
therefore writes over an existing baseline only the rows of the suite it records
(`overwrite_refusal`). A file that records no suite (written before the header held one, or
by the pytest plugin) is judged by its cases: it is replaced only by rows that keep every
case it holds. Within one suite, rows that cover less than the file (fewer paths, no lowering,
no `--impl`: `narrowing_refusal`) replace it only with `--allow-narrower`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from mhc_parity.records.identity import Selection
from mhc_parity.reports.baseline import SUITE_KEY, parse_header, selection_of
from mhc_parity.reports.baseline_load import is_baseline_file, read_first_line

# The option of `mhc-parity baseline` that lets narrower rows replace a baseline (`narrowing_refusal`).
ALLOW_NARROWER = "--allow-narrower"
# What the refusal tells a user to do instead (`mhc-parity baseline --to`, make's BASELINE=).
ELSEWHERE = "write them to another file (--to FILE; with make: BASELINE=FILE on its command line)"


def describe_suite(suite: str | None) -> str:
    """`suite` (a `run_suite` line, or None) as the refusal names it."""
    if suite is None:
        return "rows that record no suite (their run's manifest was not kept)"
    kind = "suite" if " " not in suite and not suite.startswith("-") else "selection"
    return f"{kind} {suite!r}"


def baseline_cases(path: Path) -> set[str]:
    """The case names of the rows of the baseline file `path` (read leniently: the file is
    about to be replaced, so what its digest says does not matter here)."""
    return set(_baseline_rows(path)["case"])


def _baseline_rows(path: Path) -> pd.DataFrame:
    """The case and candidate of each row of the baseline file `path`, read leniently (as `baseline_cases`)."""
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        handle.readline()  # the header line
        pairs = [(row["case"], row.get("candidate") or "") for row in csv.DictReader(handle) if row.get("case")]
    return pd.DataFrame(pairs, columns=["case", "candidate"])


def narrowing_refusal(
    target: Path, selection: Selection, *, elsewhere: str = ELSEWHERE, option: str = ALLOW_NARROWER
) -> str:
    """Why rows covering `selection` must not replace the baseline `target` ("" if they may): it
    covers cases, paths or external implementations they lack (`Selection.uncovered`), so the
    gate would stop judging those. `option` (the caller's `ALLOW_NARROWER`) lets them through (a
    case or path removed on purpose)."""
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
    """Why the rows of `suite` (a `run_suite` line, or None), which hold the cases `cases`,
    must not be written over `target` ("" if they may): `target` is a baseline recording
    another suite, or, recording none, holding cases the rows lack; `elsewhere` says what to
    do instead. A target that is not a baseline file (or does not exist) is left to the
    writer's own checks."""
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
