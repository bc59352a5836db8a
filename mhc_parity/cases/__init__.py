"""Parity cases: specs (`Case`), branch functions, init families, fixtures, registry.

Quick tour::

    from mhc_parity.cases import registry, make_fixture
    for case in registry.select(suite="smoke"):
        fixture = make_fixture(case)   # x, weights, branch_params, cotangent (NumPy)

`python -m mhc_parity.cases list --suite default` shows what a suite holds. This package knows
mhc's shapes and weight names and nothing of the harness.
"""

from mhc_parity.cases.fixtures import Fixture, make_fixture
from mhc_parity.cases.spec import Case, CaseSpecError

__all__ = ["Case", "CaseSpecError", "Fixture", "make_fixture"]
