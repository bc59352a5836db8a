# The parity matrix of this repository's kernel: one test per case x comparison,
# parametrised by the mhc-parity plugin over the implementation in pyproject.toml.
from mhc_parity.harness.pytest_plugin import check_parity


def test_parity(parity_check):
    check_parity(parity_check)
