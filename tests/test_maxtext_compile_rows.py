"""MaxText 0.2.5's kernels compiled by the real TPU compiler (libtpu) on this host: the maxtext
suite's compile rows (`mhc_parity.cases.catalogue.COMPILED_MAXTEXT_CASES`). As released, its
kernels called bare on the 2x4 token mesh fail XLA's partitioner, naming the missing
shard_map; fixed (each call in a token `shard_map`) they compile, and unsharded both do, for
every target."""

from __future__ import annotations

import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.catalogue import COMPILED_MAXTEXT_CASES
from mhc_parity.harness.engine.compile_rows import case_compile_rows, compile_names_for
from mhc_parity.harness.engine.compile_store import CompileStore
from mhc_parity.harness.engine.implementations import load_implementations
from mhc_parity.harness.engine.tpu_targets import TARGETS, compiler_missing, compiles_case

RELEASED, FIXED = "maxtext-kernel-api", "maxtext-kernel-fwd-fixed"
PROGRAMS = 4  # pre/post, forward and VJP


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


@pytest.mark.slow  # 72 compiles of MaxText's kernels and 36 of this project's: about a minute here
@pytest.mark.skipif(bool(compiler_missing()), reason=compiler_missing() or "libtpu is installed")
def test_released_kernels_fail_on_the_2x4_mesh_naming_the_shard_map_and_everything_else_compiles(kernel_apis, tmp_path):
    store = CompileStore(tmp_path)
    rows = [
        row
        for name in sorted(COMPILED_MAXTEXT_CASES)
        for row in case_compile_rows(registry.get(name), store, implementations=kernel_apis)
    ]
    sharded = [r for r in rows if "sharded(" in r["candidate"] and "unsharded" not in r["candidate"]]
    released_sharded = [r for r in sharded if r["candidate"].startswith(f"{RELEASED}/")]
    assert len(released_sharded) == len(TARGETS) * PROGRAMS
    for row in released_sharded:
        assert (row["verdict"], row["compile_cause"]) == ("fail", "partitioning"), row
        assert "cannot be automatically partitioned" in row["reason"] and "shard_map" in row["reason"], row
    others = [r for r in rows if r not in released_sharded]
    # Per (target, program): released unsharded (2 cases), fixed unsharded (2) and on 2x4 (1),
    # this project's kernels likewise (3).
    expected = len(TARGETS) * PROGRAMS * (2 + 3 + 3)
    assert len(others) == expected, len(others)
    failed = [(r["case"], r["candidate"], r["leaf"], r["reason"]) for r in others if r["verdict"] != "pass"]
    assert not failed, failed
    assert {r["candidate"].split("/")[0] for r in others} == {RELEASED, FIXED, "compile"}
