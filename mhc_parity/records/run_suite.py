"""The suite a run's rows were selected from, as one line a baseline's header can record.

`mhc-parity run` selects its cases by a suite (`--suite`; without `--suite` and `--cases`, the
default suite, or the suite `user` of its `--case-file`s) and narrows that selection with
`--cases`, `--tags`, `--dtype` and `--seed`. A baseline records the result (`suite=` in its
header, `mhc_parity.reports.baseline`), so that writing another selection's rows over it can be
refused (`mhc_parity.reports.baseline_suite`): a smoke run written over the default suite's
baseline would drop every default-suite case the smoke suite lacks, and the gate would pass
their regressions as rows the baseline does not hold.
"""

from __future__ import annotations

import shlex

from mhc_parity.records.manifest import RunRequest

DEFAULT_SUITE = "default"  # what `run` selects without --suite, --cases and --case-file
USER_SUITE = "user"  # the suite of the cases of `--case-file` files (`mhc_parity.cases.toml_cases`)


def effective_suite(request: RunRequest) -> str | None:
    """The suite `request` selected from: its `--suite`, else the default suite (or `user`
    with case files) when no `--cases` globs were given; None when the globs chose among
    every known case."""
    if request.suite is not None:
        return request.suite
    if request.case_globs is not None:
        return None
    return USER_SUITE if request.case_files else DEFAULT_SUITE


def run_suite(request: RunRequest | None) -> str | None:
    """The selection `request` made, as a baseline header records it: the suite's name
    alone for a whole suite (`default`), followed by the options that narrowed or changed it
    as the command line spelled them (`default --dtype float32`, `--cases 'lite-*'`); None
    without a request (rows whose manifest was not kept: nothing says what they were)."""
    if request is None:
        return None
    suite = effective_suite(request)
    words = [suite] if suite is not None else []
    for option, values in (
        ("--cases", request.case_globs),
        ("--tags", request.tags),
        ("--case-file", request.case_files),
    ):
        if values:
            words.append(f"{option} {shlex.join(values)}")
    for option, value in (("--dtype", request.dtype), ("--seed", request.seed)):
        if value is not None:
            words.append(f"{option} {value}")
    return " ".join(words) or None
