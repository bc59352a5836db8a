"""Every implementation through the shared checks of tests/implementation_base.py.

An implementation's tests are a subclass naming it; Mosaic runs only on a TPU (the `tpu`
marker skips it elsewhere, with the reason). The last test shows the checks fail an
implementation that is wrong.
"""

from __future__ import annotations

import pytest

from mhc_parity.harness.engine.implementations import INTERPRET, MOSAIC, REFERENCE, load_external
from tests.implementation_base import CASES, ImplementationChecks, check_rows, judged_rows


class TestReference(ImplementationChecks):
    implementation = REFERENCE


class TestInterpret(ImplementationChecks):
    implementation = INTERPRET


class TestMosaic(ImplementationChecks):
    implementation = MOSAIC
    pytestmark = pytest.mark.tpu


class TestIndependentExternal(ImplementationChecks):
    """An external implementation whose context has no h_pre: its other leaves are judged."""

    implementation = load_external("mhc_parity.harness.faults.independent_mhc:factory")


@pytest.mark.slow
def test_the_checks_fail_an_implementation_that_loses_the_post_gate_factor():
    broken = load_external("tests.external_impls:broken")
    # The verdicts are what the checks read; the failing rows' causes (not searched) are not.
    rows = judged_rows(broken, CASES[0])
    with pytest.raises(pytest.fail.Exception, match="rows did not pass"):
        check_rows(rows, leaf=lambda name: name == "out", comparisons=("vs_oracle", "vs_reference"))
