"""The parity matrix of a case suite as tests: one per case × comparison.

Run a different suite with `pytest --parity-suite default tests/test_parity_matrix.py`.
"""

from mhc_parity.harness.pytest_plugin import check_parity


def test_parity(parity_check):
    check_parity(parity_check)
