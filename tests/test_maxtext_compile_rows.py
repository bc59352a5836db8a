"""Which of the maxtext suite's cases get compile rows (`mhc_parity.cases.catalogue.COMPILED_MAXTEXT_CASES`),
for which of MaxText's implementations. What the real TPU compiler makes of them is read from
tests/test_maxtext.py's run, which makes those rows."""

from __future__ import annotations

import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.catalogue import COMPILED_MAXTEXT_CASES
from mhc_parity.harness.engine.compile_rows import compile_names_for
from mhc_parity.harness.engine.implementations import load_implementations
from mhc_parity.harness.engine.tpu_targets import TARGETS, compiles_case

RELEASED, FIXED = "maxtext-kernel-api", "maxtext-kernel-fwd-fixed"


@pytest.fixture(scope="module")
def kernel_apis():
    """MaxText's implementations that offer kernel programs: its kernel API as released and fixed."""
    pytest.importorskip("maxtext")  # the `maxtext` extra, where it installs (docs/accelerators.md)
    loaded = load_implementations("mhc_parity.maxtext_parity:implementations")
    return tuple(impl for impl in loaded if impl.kernel_programs is not None)


def test_the_maxtext_suite_compiles_its_2x4_case_and_one_unsharded_case_for_its_kernel_apis(kernel_apis):
    assert {impl.name for impl in kernel_apis} == {RELEASED, FIXED}
    compiled = [case for case in registry.select(suite="maxtext") if compiles_case(case)]
    assert {case.name for case in compiled} == set(COMPILED_MAXTEXT_CASES)
    assert sorted(str(case.mesh) for case in compiled) == ["(2, 4)", "None"]
    for case in compiled:
        assert all(not impl.envelope_reason(case) for impl in kernel_apis), case.name  # inside MaxText's envelope
        names = compile_names_for(case, kernel_apis)
        meshes = 1 if case.mesh is None else 2
        assert sum(name.startswith(f"{RELEASED}/compile-") for name in names) == len(TARGETS) * meshes
