"""Runs that need an accelerator: skipped, with the reason, everywhere else (see conftest.py).

`tpu`: the Mosaic-compiled kernels against the reference — unsharded and token-sharded,
forward leaves and every gradient leaf of one VJP — through the harness itself, so each
leaf is held to the policy's bounds (vs_reference, vs_oracle, vs_unsharded).
`gpu`: the same for the interpret-mode kernels on a GPU.

`bench/accelerator_check.sh` runs these with the smoke suite on a fresh machine.
"""

from __future__ import annotations

import jax
import pytest

from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine.implementations import INTERPRET, MOSAIC, REFERENCE
from mhc_parity.harness.engine.runner import PathPlan, Runner
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.harness.pytest_plugin import leaf_table
from mhc_parity.records.schema import OK_VERDICTS

DTYPES = ("float32", "bfloat16")


def _case(dtype: str, mesh: tuple[int, int] | None = None) -> Case:
    """A small MLP-branch case; sharded on `mesh` (data, fsdp) with one token block per shard."""
    batch = 2 if mesh is None else 2 * mesh[0]
    name = f"hardware-{dtype}-" + ("unsharded" if mesh is None else f"m{mesh[0]}x{mesh[1]}")
    return Case(
        name=name,
        batch=batch,
        sequence=256,
        streams=4,
        embedding=256,
        dtype=dtype,
        branch="mlp",
        mesh=mesh,
        block_tokens=128,
        block_tokens_bwd=128,
    )


def _token_mesh() -> tuple[int, int]:
    """All of this backend's devices on the data axis; skips when there is only one."""
    count = jax.device_count()
    if count < 2:
        pytest.skip(f"token sharding needs at least 2 {jax.default_backend()} devices, this host has {count}")
    return (count, 1)


def _assert_kernels_match(case: Case, kernel_impl, *, platform: str) -> None:
    rows = list(Runner(load_policy()).run_case(case, PathPlan((REFERENCE, kernel_impl), lowering=False)))
    bad = [r for r in rows if r["verdict"] not in OK_VERDICTS]
    assert not bad, f"{len(bad)} rows failed:\n{leaf_table(bad)}"
    kernel_rows = [r for r in rows if r["candidate"].startswith(f"{kernel_impl.name}/")]
    comparisons = {r["comparison"] for r in kernel_rows if r["verdict"] == "pass"}
    expected = {"vs_oracle", "vs_reference"} | ({"vs_unsharded"} if case.mesh else set())
    assert comparisons == expected, (comparisons, [r["reason"] for r in kernel_rows if r["verdict"] != "pass"])
    leaves = {r["leaf"] for r in kernel_rows if r["comparison"] == "vs_reference"}
    assert {"out", "h_res", "d_x", "d_res_alpha", "d_branch.w_in"} <= leaves
    assert {r["devices"].split(":")[0] for r in kernel_rows} == {platform}


# The kernel path each kind of hardware checks, with its marker.
HARDWARE = [
    pytest.param(MOSAIC, "tpu", marks=pytest.mark.tpu, id="mosaic-on-tpu"),
    pytest.param(INTERPRET, "gpu", marks=pytest.mark.gpu, id="interpret-on-gpu"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel_impl, platform", HARDWARE)
def test_kernels_match_the_reference_unsharded(kernel_impl, platform, dtype):
    _assert_kernels_match(_case(dtype), kernel_impl, platform=platform)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel_impl, platform", HARDWARE)
def test_kernels_match_the_reference_token_sharded(kernel_impl, platform, dtype):
    _assert_kernels_match(_case(dtype, _token_mesh()), kernel_impl, platform=platform)
