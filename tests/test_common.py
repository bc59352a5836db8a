"""The shared numerics of mhc_parity.mhc.common: permutations, the gate, the residual matrices."""

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mhc_parity.mhc import common
from mhc_parity.mhc.common import (
    MhcDims,
    UnsupportedInputError,
    compute_sigmoid_gate,
    lite_residual_matrix,
    permutation_matrices,
    sinkhorn_residual_matrix,
)


def test_permutation_matrices_are_the_24_distinct_permutations_of_4():
    mats = permutation_matrices(4)
    assert mats.shape == (24, 4, 4) and mats.dtype == np.float32
    assert set(np.unique(mats)) == {0.0, 1.0}
    np.testing.assert_array_equal(mats.sum(axis=1), 1.0)
    np.testing.assert_array_equal(mats.sum(axis=2), 1.0)
    assert len({m.tobytes() for m in mats}) == 24
    for mat, perm in zip(mats, itertools.permutations(range(4))):
        np.testing.assert_array_equal(mat, np.eye(4)[list(perm)])
    np.testing.assert_array_equal(mats[0], np.eye(4))


def test_permutation_matrices_are_read_only_and_cached():
    mats = permutation_matrices(3)
    assert mats is permutation_matrices(3)
    with pytest.raises(ValueError):
        mats[0, 0, 0] = 2.0
    assert permutation_matrices(2).shape == (2, 2, 2)


def test_permutation_matrices_reject_nonpositive_n():
    with pytest.raises(UnsupportedInputError, match="n >= 1"):
        permutation_matrices(0)


def test_gate_computes_in_float32_from_bfloat16_operands():
    logits = jnp.asarray(np.linspace(-3, 3, 8), jnp.bfloat16)
    scale = jnp.asarray([1.3], jnp.bfloat16)
    bias = jnp.asarray(np.linspace(-0.5, 0.5, 8), jnp.bfloat16)
    gate = compute_sigmoid_gate(logits, scale, bias, multiplier=2.0, epsilon=1e-6)
    assert gate.dtype == jnp.float32
    z = np.float64(np.asarray(scale, np.float32)) * np.asarray(logits, np.float64) + np.asarray(bias, np.float64)
    expected = 2.0 / (1.0 + np.exp(-z)) + 1e-6
    # float32 arithmetic: within a few float32 ulps, far tighter than one bfloat16 ulp.
    np.testing.assert_allclose(np.asarray(gate), expected, rtol=4e-7, atol=0)


def test_gate_does_not_round_float32_scale_and_bias_to_bfloat16():
    """The upstream bug: scale and bias cast to bfloat16 before the sigmoid."""
    logits = jnp.asarray(np.linspace(-4, 4, 16), jnp.bfloat16)
    scale = jnp.asarray([0.7123456], jnp.float32)
    bias = jnp.asarray(np.full(16, 0.3337), jnp.float32)
    gate = np.asarray(compute_sigmoid_gate(logits, scale, bias))
    z = 0.7123456 * np.asarray(logits, np.float64) + 0.3337
    np.testing.assert_allclose(gate, 1 / (1 + np.exp(-z)), rtol=4e-7)
    rounded = np.asarray(compute_sigmoid_gate(logits, scale.astype(jnp.bfloat16), bias.astype(jnp.bfloat16)))
    # The test can fail: rounding the operands moves the gate by far more than f32 noise.
    assert np.max(np.abs(rounded - gate)) > 100 * np.finfo(np.float32).eps


def test_gate_jaxpr_has_no_bfloat16_arithmetic():
    jaxpr = jax.make_jaxpr(compute_sigmoid_gate)(
        jnp.zeros((4,), jnp.bfloat16), jnp.zeros((1,), jnp.bfloat16), jnp.zeros((4,), jnp.bfloat16)
    )
    for eqn in jaxpr.jaxpr.eqns:
        if eqn.primitive.name != "convert_element_type":
            assert all(v.aval.dtype == jnp.float32 for v in eqn.outvars), eqn


def _random_logits(shape, scale, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale, jnp.float32)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_lite_residual_matrix_is_doubly_stochastic(n):
    r = len(permutation_matrices(n))
    h_res = np.asarray(lite_residual_matrix(_random_logits((5, r), 3.0), jnp.ones((1,)), jnp.zeros((r,)), n))
    assert h_res.shape == (5, n, n) and (h_res >= 0).all()
    np.testing.assert_allclose(h_res.sum(-1), 1.0, atol=2e-6)
    np.testing.assert_allclose(h_res.sum(-2), 1.0, atol=2e-6)


@pytest.mark.parametrize("logit_scale, iterations", [(1.0, 20), (2.0, 100)])
def test_sinkhorn_residual_matrix_is_doubly_stochastic(logit_scale, iterations):
    # Convergence slows as logits spread: 20 iterations suffice for unit-scale logits,
    # wider ones need more (at logit_scale=2, 20 iterations leave ~1e-3 in the rows).
    n = 4
    logits = _random_logits((6, n * n), logit_scale)
    h_res = np.asarray(sinkhorn_residual_matrix(logits, jnp.ones((1,)), jnp.zeros((n, n)), n, iterations))
    assert (h_res >= 0).all()
    np.testing.assert_allclose(h_res.sum(-2), 1.0, atol=1e-6)
    np.testing.assert_allclose(h_res.sum(-1), 1.0, atol=1e-6)


def test_collapse_and_expand_streams_keep_the_activation_dtype():
    x = jnp.ones((3, 4, 128), jnp.bfloat16)
    h = jnp.full((3, 4), 0.25, jnp.float32)
    layer_input = common.collapse_streams(h, x)
    assert layer_input.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(layer_input, np.float32), 1.0)
    eye = jnp.broadcast_to(jnp.eye(4), (3, 4, 4))
    out = common.expand_streams(eye, h, x, layer_input)
    assert out.dtype == jnp.bfloat16 and out.shape == (3, 4, 128)
    np.testing.assert_array_equal(np.asarray(out, np.float32), 1.25)


def test_expand_streams_contracts_the_first_index_of_h_res():
    x = jnp.asarray([[1.0], [10.0]])[None]  # tokens=1, n=2, C=1
    h_res = jnp.asarray([[[0.0, 1.0], [0.0, 0.0]]])  # only h_res[0, 1] set
    out = common.expand_streams(h_res, jnp.zeros((1, 2)), x, jnp.zeros((1, 1)))
    # out[j] = sum_i h_res[i, j] x[i]: stream 1 receives x[0].
    np.testing.assert_array_equal(np.asarray(out)[0, :, 0], [0.0, 1.0])


def test_dims_and_validation_errors():
    dims = MhcDims(4, 128)
    assert dims.flat_width == 512 and dims.residual_width == 24 and dims.projection_width == 32
    assert MhcDims(3, 128, "sinkhorn").weight_shapes()["res_bias"] == (3, 3)
    with pytest.raises(UnsupportedInputError, match="variant"):
        common.validate_dims(MhcDims(4, 128, "dense"))
    with pytest.raises(UnsupportedInputError, match="at most 5 streams"):
        common.validate_dims(MhcDims(6, 128))
    with pytest.raises(UnsupportedInputError, match="positive"):
        common.validate_dims(MhcDims(0, 128))


@pytest.mark.parametrize(
    "shape, dtype, match",
    [
        ((2, 4, 128), jnp.float32, "rank 3"),
        ((1, 2, 3, 128), jnp.float32, r"\(3, 128\)"),
        ((1, 2, 4, 128), jnp.float16, "float16 is not supported"),
        ((1, 2, 4, 128), jnp.int32, "int32 is not supported"),
    ],
)
def test_validate_activations_names_the_problem(shape, dtype, match):
    with pytest.raises(UnsupportedInputError, match=match):
        common.validate_activations(jnp.zeros(shape, dtype), MhcDims(4, 128))


def test_bfloat16_fixture_dtype_is_ml_dtypes():
    # jnp.bfloat16 and ml_dtypes.bfloat16 are the same type: fixtures made with NumPy
    # feed the paths without a conversion step.
    assert jnp.dtype(jnp.bfloat16) == np.dtype(ml_dtypes.bfloat16)
