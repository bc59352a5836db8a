"""pytest plugin: the parity matrix as parametrised tests, one per case × comparison.

Enabled from the root conftest.py. A test function that asks for the `parity_check`
fixture is parametrised over the cases of `--parity-suite` (default: the
MHC_PARITY_SUITE environment variable, else `smoke`) and the comparisons each case
makes; test ids are `<case name>::<comparison>`, so `pytest -k bf16` or
`pytest -k vs_unsharded` select as expected. A failing test prints the leaf table.

Each case runs once per worker (its rows are cached by case); tests of one case share
an xdist group, so with `--dist loadgroup` one worker runs all of a case's tests.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest

from harness.schema import OK_VERDICTS

DEFAULT_SUITE = "smoke"


@dataclasses.dataclass(frozen=True)
class ParityCheck:
    """One parametrised test: a case and one comparison kind."""

    case: object
    comparison: str

    @property
    def id(self) -> str:
        return f"{self.case.name}::{self.comparison}"


def pytest_addoption(parser):
    parser.addoption(
        "--parity-suite",
        default=os.environ.get("MHC_PARITY_SUITE", DEFAULT_SUITE),
        help="case suite the parity-matrix tests run (default: $MHC_PARITY_SUITE or smoke)",
    )


def comparisons_for(case) -> tuple[str, ...]:
    """The comparisons a case's rows can contain."""
    kinds = ["vs_oracle", "vs_reference"]
    if case.mesh is not None:
        kinds.append("vs_unsharded")
    kinds.append("lowering")
    return tuple(kinds)


def pytest_generate_tests(metafunc):
    if "parity_check" not in metafunc.fixturenames:
        return
    from cases import registry

    suite = metafunc.config.getoption("--parity-suite")
    params = []
    for case in registry.default_registry().select(suite=suite):
        marks = [pytest.mark.xdist_group(case.name)]
        if case.mesh is not None:
            marks.append(pytest.mark.sharded)
        for comparison in comparisons_for(case):
            check = ParityCheck(case, comparison)
            params.append(pytest.param(check, id=check.id, marks=marks))
    metafunc.parametrize("parity_check", params)


@functools.lru_cache(maxsize=None)
def _runner():
    from harness.policy import load_policy
    from harness.runner import Runner

    return Runner(load_policy())


@functools.lru_cache(maxsize=None)
def case_rows(case) -> tuple[dict, ...]:
    """Every row of one case through every built-in path (cached per process, by case)."""
    from harness.implementations import BUILTIN
    from harness.runner import PathPlan

    return tuple(_runner().run_case(case, PathPlan(implementations=tuple(BUILTIN.values()))))


def leaf_table(rows) -> str:
    """A fixed-width table of rows for a failure message."""
    lines = [f"{'verdict':<11} {'usage':>8}  {'candidate':<34} {'partner':<34} {'leaf':<16} reason / bound"]
    for r in rows:
        usage = r["bound_usage"]
        lines.append(
            f"{r['verdict']:<11} {usage:>8.3g}  {r['candidate']:<34} {r['partner']:<34} {r['leaf']:<16} "
            f"{r['reason'] or r['bound']}"
        )
    return "\n".join(lines)


def check_parity(check: ParityCheck) -> None:
    """Assert that every row of the check passed or is an explained skip/unsupported."""
    rows = [r for r in case_rows(check.case) if r["comparison"] == check.comparison]
    if not rows:
        pytest.skip(f"{check.case.name} makes no {check.comparison} comparison on this machine")
    bad = [r for r in rows if r["verdict"] not in OK_VERDICTS]
    if bad:
        pytest.fail(
            f"{len(bad)} of {len(rows)} rows of {check.id} failed:\n{leaf_table(bad)}", pytrace=False
        )
    if all(r["verdict"] == "skip" for r in rows):
        pytest.skip("; ".join(sorted({r["reason"] for r in rows}))[:300])
