"""Rows say which kernel blocks ran (issue 55): at real sizes the VMEM fitter halves the Mosaic
blocks, so a case's name no longer says what the chip ran."""

import jax.numpy as jnp
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine.collaborators import Collaborators
from mhc_parity.harness.engine.implementations import INTERPRET, MOSAIC, REFERENCE
from mhc_parity.harness.engine.kernel_blocks import blocks_label, path_blocks
from mhc_parity.harness.engine.oracle_cache import OracleCache
from mhc_parity.harness.engine.runner import PathPlan, Runner
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.mhc.kernels.config import KernelConfig
from mhc_parity.mhc.kernels.vmem import step_bytes

WIDE = "lite-n4-c4096-b1s1024-bf16-wbf16-identity-default"  # the tpu suite's widest case
MESHED = "lite-n4-c1024-b8s1024-bf16-w32-mlp-default-m2x4"


def _blocks(label: str) -> dict[str, int]:
    return {name: int(value) for name, value in (part.split("=") for part in label.split())}


def test_the_mosaic_blocks_are_the_fitters_for_the_target_and_interprets_the_cases_own():
    case = registry.get(WIDE)
    mosaic, interpret = blocks_label(case, interpret=False, mesh=None), blocks_label(case, interpret=True, mesh=None)
    assert interpret == "block_tokens=256 block_tokens_bwd=128 block_features=512"  # the defaults
    fitted = _blocks(mosaic)
    assert fitted == {"block_tokens": 64, "block_tokens_bwd": 16, "block_features": 512}
    # each fitted step fits the scoped limit; the next larger block would not have
    limit, config, dtype = KernelConfig().vmem_limit_bytes, case.mhc_config(), jnp.dtype(case.dtype)
    for kernel, field in (("pre_forward", "block_tokens"), ("pre_backward", "block_tokens_bwd")):
        assert step_bytes(kernel, config, dtype, fitted[field]).total <= limit
        assert step_bytes(kernel, config, dtype, 2 * fitted[field]).total > limit


def test_a_sharded_paths_blocks_are_those_of_its_shard_of_the_tokens():
    case = registry.get(MESHED)
    assert _blocks(blocks_label(case, interpret=False, mesh=case.mesh))["block_tokens"] <= 1024  # 8192 / 8 a shard
    small = Case(name="blocks-small", batch=2, sequence=32, streams=2, embedding=128, mesh=(2, 4))
    # Mosaic clamps its blocks to the 8 tokens of a shard; interpret mode keeps the whole batch's
    assert _blocks(blocks_label(small, interpret=False, mesh=small.mesh))["block_tokens"] == 8
    assert _blocks(blocks_label(small, interpret=True, mesh=small.mesh))["block_tokens"] == 64
    assert path_blocks(small, REFERENCE, small.mesh) == ""  # not this project's kernels


@pytest.mark.slow
def test_kernel_rows_carry_their_blocks_and_others_none(tmp_path):
    case = Case(name="blocks-rows", batch=1, sequence=32, streams=2, embedding=128, block_tokens=16)
    runner = Runner(load_policy(), Collaborators(oracle=OracleCache(tmp_path / "oracle")))
    rows = list(runner.run_case(case, PathPlan((REFERENCE, INTERPRET, MOSAIC))))
    by_candidate = {}
    for row in rows:
        by_candidate.setdefault(row["candidate"], set()).add(row["kernel_blocks"])
    assert by_candidate["reference/unsharded"] == {""}
    assert by_candidate["interpret/unsharded"] == {"block_tokens=16 block_tokens_bwd=32 block_features=128"}
    assert by_candidate["mosaic/unsharded"] == {""}  # skipped here: nothing ran
    assert by_candidate["lowering/unsharded"] == {blocks_label(case, interpret=False, mesh=None)}
