"""The Mosaic kernels' VMEM estimate and the token blocks fitted to the scoped limit.

A Mosaic grid step must fit the scoped VMEM limit, or libtpu's compiler stops with
`CompileTimeScopedVmemOom` (measured: float32 embedding 1024 with 512-token blocks on v5e).
`mhc_parity.mhc.kernels.vmem` halves the blocks until its estimate fits; these tests pin
what the estimate counts, that it follows the blocks and not the array, that every `tpu`
suite case gets blocks inside the limit (or a refusal that names both figures), and — where
libtpu's compiler is installed — that a fitted step compiles where the case's own block
does not.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from mhc_parity.cases.catalogue import tpu_cases
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.kernels import KernelConfig
from mhc_parity.mhc.kernels import api as kernel_api
from mhc_parity.mhc.kernels.vmem import BACKWARD_KERNELS, FORWARD_KERNELS, fit_blocks, step_bytes, tile_bytes
from mhc_parity.mhc.types import MhcConfig

MOSAIC = KernelConfig(interpret=False)


def test_a_vmem_buffer_is_counted_in_whole_tiles_of_its_dtype():
    assert tile_bytes((256, 512), jnp.float32) == 256 * 512 * 4
    assert tile_bytes((256, 4), jnp.float32) == 256 * 128 * 4  # 4 lanes of 128
    assert tile_bytes((256, 4, 4), jnp.float32) == 256 * 8 * 128 * 4  # an (8, 128) tile per token
    assert tile_bytes((8, 128), jnp.bfloat16) == 16 * 128 * 2  # bfloat16 packs 16 rows to a tile
    assert tile_bytes((7,), jnp.float32) == 8 * 128 * 4


def test_a_step_grows_with_its_block_and_its_weights_never_with_the_tokens():
    config = MhcConfig(4, 1024)
    for kernel in (*FORWARD_KERNELS, *BACKWARD_KERNELS):
        small = step_bytes(kernel, config, jnp.bfloat16, 64, 512)
        large = step_bytes(kernel, config, jnp.bfloat16, 128, 512)
        assert large.blocks == 2 * small.blocks and large.working == 2 * small.working
        assert large.resident == small.resident
    # The same request over 4x the tokens gets the same blocks: a step does not see the array.
    request = dataclasses.replace(MOSAIC, block_tokens=512, block_tokens_bwd=128)
    assert fit_blocks(request, config, jnp.float32, 2048) == fit_blocks(request, config, jnp.float32, 8192)


def test_the_estimate_covers_the_step_libtpu_refused():
    # libtpu 0.0.50.1 for v5e: post_forward, float32, embedding 1024, 512 tokens x 512 features
    # asked 33.51 MiB of scoped VMEM (limit 32 MiB): the estimate must not fall below it.
    need = step_bytes("post_forward", MhcConfig(4, 1024), jnp.float32, 512, 512)
    assert need.total >= 33.51 * 2**20
    assert need.total > MOSAIC.vmem_limit_bytes


@pytest.mark.parametrize("case", tpu_cases(), ids=lambda c: c.name)
def test_every_tpu_case_gets_blocks_that_fit_and_divide_its_shard(case):
    local = case.batch * case.sequence // (np.prod(case.mesh) if case.mesh else 1)
    kernel = dataclasses.replace(MOSAIC, **case.block_sizes)
    fitted = fit_blocks(
        dataclasses.replace(kernel, block_tokens=min(kernel.block_tokens, local)),
        case.mhc_config(),
        jnp.dtype(case.dtype),
        local,
    )
    config, dtype = case.mhc_config(), jnp.dtype(case.dtype)
    for kernel_name in FORWARD_KERNELS:
        need = step_bytes(kernel_name, config, dtype, fitted.block_tokens, fitted.block_features)
        assert need.total <= fitted.vmem_limit_bytes
    for kernel_name in BACKWARD_KERNELS:
        assert step_bytes(kernel_name, config, dtype, fitted.block_tokens_bwd).total <= fitted.vmem_limit_bytes
    for block in (fitted.block_tokens, fitted.block_tokens_bwd):
        assert block % 8 == 0 and local % block == 0
    assert config.embedding % fitted.block_features == 0 and fitted.block_features % 128 == 0


def test_weights_too_large_for_any_block_are_refused_with_both_figures():
    with pytest.raises(
        UnsupportedInputError, match=r"needs [0-9.]+ MiB of VMEM .* weights and accumulators.*32.00 MiB"
    ):
        fit_blocks(MOSAIC, MhcConfig(4, 16384), jnp.float32, 1024)


def test_only_mosaic_blocks_are_fitted():
    config, request = MhcConfig(4, 1024), dict(block_tokens=512, block_tokens_bwd=128)
    interpret = kernel_api._resolve_blocks(KernelConfig(**request), None, 4, 2048, config, jnp.float32)
    assert (interpret.block_tokens, interpret.block_tokens_bwd) == (512, 128)
    mosaic = kernel_api._resolve_blocks(KernelConfig(interpret=False, **request), None, 4, 2048, config, jnp.float32)
    assert mosaic.block_tokens < 512


@pytest.mark.slow
def test_libtpu_compiles_the_fitted_step_that_the_requested_block_overflows():
    pytest.importorskip("libtpu", reason="libtpu's compiler is not installed")
    import jax
    from jax.experimental import topologies
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

    from mhc_parity.harness.engine.compile_rows import compile_lowered, lower_on_target
    from mhc_parity.mhc.kernels.lowering import kernel_programs

    devices = np.asarray(topologies.get_topology_desc("v5e=1x1", platform="tpu").devices).reshape(1, 1)
    mesh = Mesh(devices, ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)
    config, kernel = MhcConfig(4, 1024), KernelConfig(block_tokens=512, block_features=512)

    def compile_post_forward(kernel):
        """As the compile rows compile: a compile-only program kept out of JAX's persistent cache
        (which an earlier test of this process may have turned on, and could not read it back)."""
        fn, structs = kernel_programs(config, batch=1, seq=1024, dtype=jnp.float32, kernel=kernel)["post_forward"]
        replicated = NamedSharding(mesh, PartitionSpec())
        placed = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), structs)
        with jax.set_mesh(mesh):
            return compile_lowered("post_forward", lower_on_target(fn, placed))

    fitted = compile_post_forward(kernel)
    assert fitted.ok, fitted.error
    unfitted = pytest.MonkeyPatch()
    unfitted.setattr(kernel_api, "fit_blocks", lambda kernel, *_: kernel)
    try:
        overflowing = compile_post_forward(kernel)
    finally:
        unfitted.undo()
    assert not overflowing.ok and overflowing.cause == "vmem", overflowing.error
    assert "CompileTimeScopedVmemOom" in overflowing.error
