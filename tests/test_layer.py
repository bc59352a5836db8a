"""The flax.nnx layer: initialisation, weights(), validation, and its two paths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mhc_parity.mhc import reference
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.layer import IDENTITY_BIAS_LOGIT, INITIAL_GATE_SCALE, ManifoldConstrainedHyperConnections
from mhc_parity.mhc.types import GATE_FIELDS, MATMUL_FIELDS, WEIGHT_FIELDS, MhcWeights
from tests.support import random_activations, random_weights


def _layer(**kwargs):
    return ManifoldConstrainedHyperConnections(4, 128, rngs=nnx.Rngs(0), **kwargs)


def test_initialisation_starts_near_a_plain_residual_connection():
    layer = _layer()
    w = layer.weights()
    np.testing.assert_array_equal(np.asarray(w.pre_scale), np.float32(INITIAL_GATE_SCALE))
    np.testing.assert_array_equal(np.asarray(w.norm_scale), 1.0)
    assert float(w.res_bias[0]) == IDENTITY_BIAS_LOGIT and float(jnp.max(jnp.abs(w.res_bias[1:]))) == 0.0
    _, ctx = reference.pre(random_activations((1, 4, 4, 128)), w, config=layer.config)
    # The identity permutation dominates the residual mix.
    assert float(jnp.min(jnp.diagonal(ctx.h_res, axis1=-2, axis2=-1))) > 0.5


def test_sinkhorn_initialisation_favours_the_diagonal():
    layer = ManifoldConstrainedHyperConnections(3, 128, variant="sinkhorn", rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(np.asarray(layer.weights().res_bias), IDENTITY_BIAS_LOGIT * np.eye(3))


def test_initializers_can_be_overridden_and_unknown_names_rejected():
    layer = _layer(initializers={"pre_bias": lambda key, shape, dtype: jnp.full(shape, 0.5, dtype)})
    np.testing.assert_array_equal(np.asarray(layer.weights().pre_bias), 0.5)
    with pytest.raises(ValueError, match="pre_bais"):
        _layer(initializers={"pre_bais": lambda key, shape, dtype: jnp.zeros(shape)})


def test_weights_casts_matmul_leaves_but_keeps_gate_parameters():
    layer = _layer(dtype=jnp.bfloat16, weight_dtype=jnp.float32)
    w = layer.weights()
    assert isinstance(w, MhcWeights)
    for name in MATMUL_FIELDS:
        assert getattr(w, name).dtype == jnp.bfloat16, name
    for name in GATE_FIELDS:
        assert getattr(w, name).dtype == jnp.float32, name


def test_load_weights_round_trips_and_validates():
    layer = _layer()
    weights = random_weights(layer.config, seed=5)
    layer.load_weights(weights)
    for name in WEIGHT_FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(layer.weights(), name)), np.asarray(getattr(weights, name)))
    bad = MhcWeights(**{**weights.as_dict(), "res_bias": jnp.zeros((23,))})
    with pytest.raises(UnsupportedInputError, match=r"res_bias has shape \(23,\), expected \(24,\)"):
        layer.load_weights(bad)


def test_call_matches_the_reference_functions_and_is_differentiable():
    layer = _layer()
    layer.load_weights(random_weights(layer.config))
    x = random_activations((2, 8, 4, 128))
    out, inter = layer.call_with_intermediates(jnp.tanh, x)
    layer_input, ctx = reference.pre(x, layer.weights(), config=layer.config)
    np.testing.assert_array_equal(np.asarray(inter["layer_input"]), np.asarray(layer_input))
    np.testing.assert_array_equal(
        np.asarray(out), np.asarray(reference.post(jnp.tanh(layer_input), ctx, config=layer.config))
    )

    graphdef, state = nnx.split(layer)
    grads = jax.grad(lambda s: jnp.sum(nnx.merge(graphdef, s)(jnp.tanh, x) ** 2))(state)
    for name in WEIGHT_FIELDS:
        assert float(jnp.max(jnp.abs(grads[name][...]))) > 0, f"no gradient reaches {name}"


def test_call_rejects_bad_inputs_with_clear_errors():
    layer = _layer()
    with pytest.raises(UnsupportedInputError, match="layer computes in float32"):
        layer(jnp.tanh, jnp.zeros((1, 2, 4, 128), jnp.bfloat16))
    with pytest.raises(UnsupportedInputError, match=r"expects \(4, 128\)"):
        layer(jnp.tanh, jnp.zeros((1, 2, 4, 256)))
    with pytest.raises(UnsupportedInputError, match="layer_output has shape"):
        layer(lambda h: h[..., :64], jnp.zeros((1, 2, 4, 128)))
    with pytest.raises(UnsupportedInputError, match="at most 5 streams"):
        ManifoldConstrainedHyperConnections(6, 128, rngs=nnx.Rngs(0))
