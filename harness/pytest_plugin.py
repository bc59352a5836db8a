"""pytest plugin: the parity matrix as parametrised tests, one per case × comparison.

Enabled from the root conftest.py (`pytest_plugins`). It sets the XLA flags
(`harness.env.ensure_host_devices`) when pytest configures, before any test computes. A test function that asks for the `parity_check`
fixture is parametrised over the cases of `--parity-suite` (default: the
MHC_PARITY_SUITE environment variable, else `smoke`) and the comparisons each case
makes; test ids are `<case name>::<comparison>`, so `pytest -k bf16` or
`pytest -k vs_unsharded` select as expected. A failing test prints the leaf table.

Each case runs once per process (its rows are cached by case). Tests of one case share an
xdist group (`--dist loadgroup` keeps such a group on one worker where pytest-xdist can
tag tests; this project runs `--dist loadscope`, which keeps the whole module on one).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest

from cases import registry
from harness.env import ensure_host_devices
from harness.implementations import BUILTIN
from harness.plan import PathPlan
from harness.policy import load_policy
from harness.runner import Runner
from harness.summary import rows_table
from reports.schema import OK_VERDICTS

DEFAULT_SUITE = "smoke"


@dataclasses.dataclass(frozen=True)
class ParityCheck:
    """One parametrised test: a case and one comparison kind."""

    case: object
    comparison: str

    @property
    def id(self) -> str:
        return f"{self.case.name}::{self.comparison}"


def pytest_configure(config):
    ensure_host_devices()


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
    return Runner(load_policy())


@functools.lru_cache(maxsize=None)
def case_rows(case) -> tuple[dict, ...]:
    """Every row of one case through every built-in path (cached per process, by case)."""
    return tuple(_runner().run_case(case, PathPlan(implementations=tuple(BUILTIN.values()))))


def leaf_table(rows) -> str:
    """A plain-text table of rows for a failure message (nothing cut)."""
    return rows_table(rows, limit=None)


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
