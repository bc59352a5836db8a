"""mhc_parity.cases.init_families and mhc_parity.cases.branches: each family does what its docstring claims."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mhc_parity.cases.branches import BRANCHES, get_branch
from mhc_parity.cases.fixtures import generate_fixture
from mhc_parity.cases.init_families import INIT_FAMILIES, generate_masters, get_init_family
from mhc_parity.cases.spec import Case
from mhc_parity.mhc.common import DEFAULT_RMS_EPSILON, permutation_matrices


def _case(**changes) -> Case:
    return Case(**{**dict(name="f", batch=2, sequence=64, streams=4, embedding=128), **changes})


def _bf16(a):
    return np.asarray(a, np.float64).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _gates(x, w, n, fold_dtype_round=lambda a: a, gate_round=lambda a: a):
    """Float64 model of the three gates of mHC-lite: h_pre, h_post (T, n), h_res (T, n, n)."""
    v = np.asarray(x, np.float64).reshape(-1, x.shape[2] * x.shape[3])
    rms_inv = 1.0 / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + DEFAULT_RMS_EPSILON)
    alphas = np.concatenate([np.asarray(w[k], np.float64) for k in ("pre_alpha", "post_alpha", "res_alpha")], -1)
    folded = fold_dtype_round(np.asarray(w["norm_scale"], np.float64)[:, None] * alphas)
    proj = rms_inv * (v @ folded)
    g = {
        k: gate_round(np.asarray(w[k], np.float64))
        for k in ("pre_scale", "pre_bias", "post_scale", "post_bias", "res_scale", "res_bias")
    }
    sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    h_pre = sigmoid(g["pre_scale"] * proj[:, :n] + g["pre_bias"])
    h_post = 2.0 * sigmoid(g["post_scale"] * proj[:, n : 2 * n] + g["post_bias"])
    z = g["res_scale"] * proj[:, 2 * n :] + g["res_bias"]
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    h_res = np.einsum("tp,pij->tij", p, permutation_matrices(n).astype(np.float64))
    return h_pre, h_post, h_res


def test_every_family_is_documented_and_finite():
    for name, family in INIT_FAMILIES.items():
        assert "Stresses" in family.stresses or name == "default", name
        assert get_init_family(name) is family
        for variant in ("lite", "sinkhorn"):
            masters = generate_masters(_case(init=name, variant=variant, branch="mlp"))
            arrays = [masters.x, masters.cotangent, *masters.weights.values(), *masters.branch_params.values()]
            assert all(np.all(np.isfinite(a)) for a in arrays), (name, variant)
    with pytest.raises(KeyError, match="did you mean 'mixed_signs'"):
        get_init_family("mixed_sign")


def test_default_family_has_nontrivial_leaves_and_prefers_the_identity():
    m = generate_masters(_case())
    for name, leaf in m.weights.items():
        assert np.all(leaf != 0) and np.std(leaf) > 0 or leaf.size == 1, name
    assert np.argmax(m.weights["res_bias"]) == 0  # identity permutation
    assert all(0.05 < float(m.weights[k][0]) < 1.0 for k in ("pre_scale", "post_scale", "res_scale"))
    sk = generate_masters(_case(variant="sinkhorn"))
    assert np.all(np.argmax(sk.weights["res_bias"], axis=1) == np.arange(4))


def test_saturated_gates_saturate_most_tokens():
    case = _case(init="saturated_gates")
    h_pre, h_post, h_res = _gates(generate_masters(case).x, generate_masters(case).weights, 4)
    saturated = np.mean((h_pre < 1e-4) | (h_pre > 1 - 1e-4))
    assert 0.5 < saturated < 1.0  # most saturated, some still in the transition region
    assert np.mean(h_res.max(axis=(-1, -2)) > 0.99) > 0.5


def test_peaky_permutation_concentrates_on_one_non_identity_permutation():
    masters = generate_masters(_case(init="peaky_permutation"))
    bias = masters.weights["res_bias"]
    peak = int(np.argmax(bias))
    assert peak != 0 and bias[peak] - np.delete(bias, peak).max() > 8
    _, _, h_res = _gates(masters.x, masters.weights, 4)
    np.testing.assert_allclose(h_res, np.broadcast_to(permutation_matrices(4)[peak], h_res.shape), atol=1e-3)


def test_near_zero_rms_has_every_kind_of_small_row():
    case = _case(init="near_zero_rms")
    x = generate_fixture(case).x.astype(np.float64).reshape(case.tokens, -1)
    mean_sq = np.mean(x * x, axis=-1)
    assert np.any(mean_sq == 0.0)
    assert np.any((mean_sq > 0) & (mean_sq < 1e-10))
    assert np.any((mean_sq > 0.3 * DEFAULT_RMS_EPSILON) & (mean_sq < 3 * DEFAULT_RMS_EPSILON))
    assert np.any(mean_sq > 0.5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_large_magnitude_is_large_but_float32_safe(dtype):
    case = _case(init="large_magnitude", dtype=dtype, embedding=1024)
    x = generate_fixture(case).x.astype(np.float64)
    assert np.max(np.abs(x)) > 1e10
    mean_sq = np.mean(x.reshape(case.tokens, -1) ** 2, axis=-1)
    f32 = np.finfo(np.float32)
    assert np.sum(x.reshape(case.tokens, -1) ** 2, axis=-1).max() < f32.max / 1e6  # Σv² far from overflow
    assert (mean_sq.max() ** -1.5) > f32.tiny * 1e3  # rms⁻³ stays a normal float32


def test_mixed_signs_flip_scales_and_cancel_streams():
    masters = generate_masters(_case(init="mixed_signs"))
    w = masters.weights
    assert w["pre_scale"][0] < 0 < w["post_scale"][0] and w["res_scale"][0] < 0
    assert np.any(w["norm_scale"] < 0) and np.any(w["norm_scale"] > 0)
    h_pre, _, _ = _gates(masters.x, w, 4)
    x = masters.x.reshape(-1, 4, 128)
    collapsed = np.einsum("ts,tsc->tc", h_pre, x)
    terms = np.einsum("ts,tsc->tc", h_pre, np.abs(x))
    assert np.median(np.abs(collapsed) / terms) < 0.1  # heavy cancellation


@pytest.mark.parametrize("streams", [2, 3, 4])
def test_bf16_inexact_gates_make_a_stray_cast_far_louder_than_bf16_noise(streams):
    """Pre-rounding the gate scales/biases to bf16 moves every gate ≥ 8× more than bf16 noise does.

    Noise: the legitimate bf16 run rounds the folded projection to bfloat16 (x already is).
    Fault: the gate scales and biases rounded to bfloat16 before the affine map.
    """
    case = _case(init="bf16_inexact_gates", dtype="bfloat16", streams=streams)
    fixture = generate_fixture(case)
    x, w = fixture.x.astype(np.float64), {k: v.astype(np.float64) for k, v in fixture.weights.items()}
    for name in ("pre_scale", "pre_bias", "post_scale", "post_bias", "res_scale", "res_bias"):
        assert np.all(_bf16(w[name]) != w[name]), name  # none representable in bfloat16
    exact = _gates(x, w, streams)
    noise = _gates(x, w, streams, fold_dtype_round=_bf16)
    fault = _gates(x, w, streams, gate_round=_bf16)
    for name, e, nz, f in zip(("h_pre", "h_post", "h_res"), exact, noise, fault):
        noise_err, fault_err = np.max(np.abs(nz - e)), np.max(np.abs(f - e))
        assert fault_err > 8 * noise_err, (name, fault_err, noise_err)


@pytest.mark.parametrize("name", sorted(BRANCHES))
def test_branches_are_dtype_polymorphic(name):
    branch = get_branch(name)
    rng = np.random.default_rng(0)
    masters = branch.init(rng, 128)
    assert {k: v.shape for k, v in masters.items()} == branch.param_shapes(128)
    assert all(v.dtype == np.float64 for v in masters.values())
    h = rng.standard_normal((2, 8, 128))
    for dtype in (jnp.float32, jnp.bfloat16):
        params = {k: jnp.asarray(v, dtype) for k, v in masters.items()}
        out = branch.apply(params, jnp.asarray(h, dtype))
        assert out.dtype == dtype and out.shape == h.shape
    with jax.enable_x64(True):
        out64 = branch.apply({k: jnp.asarray(v) for k, v in masters.items()}, jnp.asarray(h))
        assert out64.dtype == jnp.float64
    out32 = branch.apply({k: jnp.asarray(v, jnp.float32) for k, v in masters.items()}, jnp.asarray(h, jnp.float32))
    np.testing.assert_allclose(np.asarray(out32), np.asarray(out64), rtol=1e-4, atol=1e-5)
    if name == "mlp":  # every parameter has a non-trivial gradient
        grads = jax.grad(lambda p: jnp.sum(branch.apply(p, jnp.asarray(h, jnp.float32)) ** 2))(
            {k: jnp.asarray(v, jnp.float32) for k, v in masters.items()}
        )
        assert all(float(jnp.max(jnp.abs(g))) > 0 for g in grads.values())
    with pytest.raises(KeyError, match="did you mean"):
        get_branch("mpl")


def test_masters_are_float64_and_shape_checked():
    masters = generate_masters(_case(branch="mlp", streams=3))
    assert masters.x.dtype == np.float64 and masters.weights["res_alpha"].shape == (384, math.factorial(3))
