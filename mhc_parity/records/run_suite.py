"""The suite a run's rows were selected from, as one line a baseline's header records (`suite=`), so that writing
another selection's rows over a baseline can be refused (`mhc_parity.reports.gate.comparability`): a smoke run over the
default baseline would drop every case the smoke suite lacks.
"""

from __future__ import annotations

import shlex

from mhc_parity.records.manifest import RunRequest

DEFAULT_SUITE = "default"  # what `run` selects without --suite, --cases and --case-file
USER_SUITE = "user"  # the suite of the cases of `--case-file` files (`mhc_parity.cases.toml_cases`)


def effective_suite(request: RunRequest) -> str | None:
    """`--suite`, else the default suite (`user` with case files) when no `--cases` globs were given; None when the
    globs chose among every known case."""
    if request.suite is not None:
        return request.suite
    if request.case_globs is not None:
        return None
    return USER_SUITE if request.case_files else DEFAULT_SUITE


def run_suite(request: RunRequest | None) -> str | None:
    """The suite name followed by the options that narrowed it as typed (`default --dtype float32`, `--cases 'lite-*'`);
    None without a request (nothing says what the rows were)."""
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
