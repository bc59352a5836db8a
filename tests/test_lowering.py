"""Mosaic (TPU) lowering of the kernel programs from a CPU host."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from mhc_parity.mhc.kernels import KernelConfig, forward
from mhc_parity.mhc.kernels.lowering import PROGRAMS, abstract_tpu_mesh, lower_for_tpu, lower_kernel_programs
from mhc_parity.mhc.types import MhcConfig

CONFIG = MhcConfig(4, 256)
KERNEL = KernelConfig(block_tokens=64, block_tokens_bwd=32, block_features=128)


def _by_name(results):
    assert [r.program for r in results] == list(PROGRAMS)
    return {r.program: r for r in results}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_unsharded_programs_lower_for_tpu(dtype):
    for r in lower_kernel_programs(CONFIG, batch=2, seq=128, dtype=dtype, kernel=KERNEL):
        assert r.ok, (r.program, r.error)


@pytest.mark.sharded
@pytest.mark.parametrize("mesh_shape", [(2, 4), (8, 1), (1, 8)])
def test_token_sharded_programs_lower_for_tpu(mesh_shape):
    results = lower_kernel_programs(CONFIG, batch=8, seq=128, kernel=KERNEL, mesh_shape=mesh_shape)
    for r in results:
        assert r.ok, (r.program, r.error)


@pytest.mark.sharded
def test_bare_kernels_on_sharded_inputs_fail_with_partitioning_error():
    results = _by_name(lower_kernel_programs(CONFIG, batch=8, seq=128, kernel=KERNEL, mesh_shape=(2, 4), bare=True))
    for name, r in results.items():
        assert not r.ok, name
        assert "Mosaic kernels cannot be automatically partitioned" in r.error, (name, r.error)


def test_block_shape_violation_is_caught_by_lowering():
    # Called below the API's own checks: a 12-token block breaks Mosaic's (8, 128) rule.
    n, c = CONFIG.streams, CONFIG.embedding
    p = CONFIG.dims.projection_width
    kernel = dataclasses.replace(KERNEL, interpret=False)

    def fn(x2, folded, *gates):
        return forward.pre_forward(x2, folded, gates, config=CONFIG, kernel=kernel, block=12)

    structs = [jax.ShapeDtypeStruct((48, n * c), jnp.float32), jax.ShapeDtypeStruct((n * c, p), jnp.float32)]
    structs += [jax.ShapeDtypeStruct(s, jnp.float32) for s in [(1, 1), (1, n), (1, 1), (1, n), (1, 1), (1, 24)]]
    r = lower_for_tpu("pre_forward_block12", fn, structs, abstract_tpu_mesh())
    assert not r.ok
    assert "divisible by 8" in r.error, r.error
    # The same program with a legal block lowers: the failure is the block, not the setup.
    ok = lower_for_tpu(
        "pre_forward_block16",
        functools.partial(
            lambda x2, folded, *g: forward.pre_forward(x2, folded, g, config=CONFIG, kernel=kernel, block=16)
        ),
        structs,
        abstract_tpu_mesh(),
    )
    assert ok.ok, ok.error


def test_unsupported_input_becomes_a_failed_row_not_an_exception():
    bad = dataclasses.replace(KERNEL, block_features=64)
    results = _by_name(lower_kernel_programs(CONFIG, batch=2, seq=128, kernel=bad))
    assert not results["post_forward"].ok
    assert "UnsupportedInputError" in results["post_forward"].error
    assert results["pre_forward"].ok
