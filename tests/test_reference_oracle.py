"""The reference path against the independent float64 oracle."""

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhc import oracle, reference
from mhc.types import WEIGHT_FIELDS, MhcConfig
from tests.support import max_rel_err, mlp_params, random_activations, random_weights, tanh_mlp_branch

SHAPE = (2, 16, 4, 128)

# float32: every leaf within this many float32 epsilons (normalised by max|oracle|).
# Sums run over at most B·S·n·C = 16k terms; observed errors are ~5 eps, so 32 eps leaves room while any
# real slip (a wrong epsilon, a lost factor) is orders of magnitude larger.
F32_LEAF_BOUND = 32 * np.finfo(np.float32).eps
# bfloat16: 8 significant bits (eps 2^-7); the reference rounds x, the folded weights
# and every output once, so a few eps per leaf is what the arithmetic explains.
BF16_LEAF_BOUND = 4 * 2.0**-7


def _reference_vjp(x, weights, params, cotangent, config):
    def run(x_, w_, p_):
        layer_input, ctx = reference.pre(x_, w_, config=config)
        out = reference.post(tanh_mlp_branch(p_, layer_input), ctx, config=config)
        return out, {"layer_input": layer_input, "h_pre": ctx.h_pre, "h_post": ctx.h_post, "h_res": ctx.h_res}

    out, pullback, aux = jax.vjp(jax.jit(run), x, weights, params, has_aux=True)
    d_x, d_w, d_p = pullback(cotangent)
    forward = {"out": out, **aux}
    grads = {"d_x": d_x, **{f"d_{k}": v for k, v in d_w.as_dict().items()}, **{f"d_branch.{k}": v for k, v in d_p.items()}}
    return forward, grads


def _oracle_leaves(x, weights, params, cotangent, config):
    res = oracle.run_oracle(x, weights, tanh_mlp_branch, params, cotangent, config)
    grads = {"d_x": res.d_x, **{f"d_{k}": v for k, v in res.d_weights.items()}, **{f"d_branch.{k}": v for k, v in res.d_branch.items()}}
    return res.forward, grads


def _leaf_errors(config, dtype, weight_dtype):
    x = random_activations(SHAPE, dtype=dtype)
    weights = random_weights(config, dtype=weight_dtype)
    params = mlp_params(SHAPE[-1], dtype=weight_dtype)
    cotangent = random_activations(SHAPE, seed=7, dtype=dtype)
    fwd, grads = _reference_vjp(x, weights, params, cotangent, config)
    o_fwd, o_grads = _oracle_leaves(x, weights, params, cotangent, config)
    errors = {k: max_rel_err(fwd[k], o_fwd[k]) for k in fwd}
    errors.update({k: max_rel_err(grads[k], o_grads[k]) for k in grads})
    assert set(grads) == {"d_x", "d_branch.w", "d_branch.b", *(f"d_{f}" for f in WEIGHT_FIELDS)}
    return errors


@pytest.mark.parametrize("variant", ["lite", "sinkhorn"])
def test_reference_matches_oracle_in_float32(variant):
    config = MhcConfig(streams=4, embedding=128, variant=variant)
    errors = _leaf_errors(config, jnp.float32, jnp.float32)
    bad = {k: v for k, v in errors.items() if not v <= F32_LEAF_BOUND}
    assert not bad, f"leaves beyond {F32_LEAF_BOUND:.2e}: {bad}"


@pytest.mark.parametrize("weight_dtype", [jnp.float32, jnp.bfloat16])
def test_reference_error_against_oracle_in_bfloat16_is_bounded(weight_dtype, record_property):
    config = MhcConfig(streams=4, embedding=128)
    errors = _leaf_errors(config, jnp.bfloat16, weight_dtype)
    for leaf, err in errors.items():
        record_property(f"max_rel_err[{leaf}]", f"{err:.3e}")
    bad = {k: v for k, v in errors.items() if not v <= BF16_LEAF_BOUND}
    assert not bad, f"leaves beyond {BF16_LEAF_BOUND:.2e}: {bad}"
    # bfloat16 really is coarser: the comparison can tell the dtypes apart.
    assert max(errors.values()) > F32_LEAF_BOUND


def test_oracle_catches_a_lost_post_gate_factor():
    config = MhcConfig(streams=4, embedding=128)
    x = random_activations(SHAPE)
    weights = random_weights(config)
    layer_input, ctx = reference.pre(x, weights, config=config)
    broken = reference.post(layer_input, ctx.__class__(ctx.x, ctx.h_pre, ctx.h_post / 2, ctx.h_res), config=config)
    truth = oracle.oracle_forward(x, weights, lambda h: h, config)["out"]
    assert max_rel_err(broken, truth) > 1e3 * F32_LEAF_BOUND


def test_oracle_is_independent_of_the_shared_helpers():
    """A bug in mhc.common must not be reproduced by the ground truth."""
    source = pathlib.Path(oracle.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not {m for m in imported if m == "mhc" or m.startswith("mhc.")}, imported


def test_oracle_permutations_follow_itertools_order():
    mats = oracle.oracle_permutations(3)
    assert mats.shape == (6, 3, 3) and mats.dtype == np.float64
    np.testing.assert_array_equal(mats[1], np.eye(3)[[0, 2, 1]])


def test_oracle_returns_the_cotangent_at_the_branch_output():
    config = MhcConfig(streams=2, embedding=128)
    shape = (1, 4, 2, 128)
    x = random_activations(shape)
    ct = random_activations(shape, seed=3)
    res = oracle.run_oracle(x, random_weights(config), lambda p, h: h, {}, ct, config)
    # out[j] += h_post[j] * y  =>  d_y = sum_j h_post[j] ct[j]
    expected = np.einsum("bsn,bsnc->bsc", res.forward["h_post"], np.asarray(ct, np.float64))
    np.testing.assert_allclose(res.d_layer_output, expected, rtol=1e-12)
    assert res.forward["out"].dtype == np.float64


def test_oracle_rounding_noise_measures_sensitivity_proportional_to_the_roundoff():
    config = MhcConfig(streams=4, embedding=128)
    x = random_activations(SHAPE)
    weights = random_weights(config)
    params = mlp_params(SHAPE[-1])
    ct = random_activations(SHAPE, seed=7)
    exact = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config)
    again = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config, rounding_noise=(5, 0.0))
    np.testing.assert_array_equal(exact.forward["out"], again.forward["out"])
    spreads = []
    for u in (2.0**-24, 2.0**-8):
        noisy = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config, rounding_noise=(5, u))
        spreads.append(max_rel_err(noisy.d_weights["res_alpha"], exact.d_weights["res_alpha"]))
        # one rounding per operation moves a leaf by a few roundings, not by orders more
        assert u / 4 < max_rel_err(noisy.forward["out"], exact.forward["out"]) < 64 * u
    # linear in the roundoff: 2^16 times the noise, ~2^16 times the spread
    assert 2.0**14 < spreads[1] / spreads[0] < 2.0**18
