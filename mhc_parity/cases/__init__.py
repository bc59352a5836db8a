"""Parity cases: specs (`Case`), branch functions, init families, fixtures (a case -> its NumPy
inputs), registry. Knows mhc's shapes and weight names, nothing of the harness.
"""

from mhc_parity.cases.fixtures import Fixture, make_fixture
from mhc_parity.cases.spec import Case, CaseSpecError

__all__ = ["Case", "CaseSpecError", "Fixture", "make_fixture"]
