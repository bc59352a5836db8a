"""Kernel path (Pallas interpret mode) vs the reference path: values, every gradient, errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhc.kernels.forward as kernel_forward
from mhc import reference
from mhc.common import UnsupportedInputError, compute_sigmoid_gate
from mhc.kernels import KernelConfig, post, pre
from mhc.types import WEIGHT_FIELDS, MhcConfig, MhcContext
from tests.support import random_activations, random_weights

CONFIG = MhcConfig(4, 128)
KERNEL = KernelConfig(block_tokens=32, block_tokens_bwd=16, block_features=128)
SHAPE = (2, 32, 4, 128)  # 64 tokens: 2 forward blocks, 4 backward blocks

# max|kernel - reference| / max|reference| per leaf. Both paths run the same helpers
# in float32; they differ only in summation order (f32) and, for bfloat16 leaves, in
# which side of a rounding boundary a value lands (one ulp = 2^-8 relative, up to
# 2^-7 of the leaf's max). Gate-scale gradients are sums with cancellation, hence
# 1e-5 rather than a few f32 ulps for float32.
TOL = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2.0 ** -7 + 1e-6}


def _rel_err(a, b) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a64)), "kernel produced NaN/Inf"
    return float(np.max(np.abs(a64 - b64)) / max(np.max(np.abs(b64)), 1e-30))


def _inputs(dtype, weight_dtype=None):
    w = random_weights(CONFIG, seed=3).astype_for_compute(weight_dtype or dtype)
    x = random_activations(SHAPE, seed=4, dtype=dtype)
    return x, w


def _pre_vjp(impl_pre, x, w, d_li, d_ctx):
    (li, ctx), vjp = jax.vjp(impl_pre, x, w)
    return li, ctx, vjp((d_li, d_ctx))


def _run_pre(use_kernel, x, w, seed=10):
    b, s, n, c = x.shape
    d_li = random_activations((b, s, c), seed=seed, dtype=x.dtype)
    d_ctx = MhcContext(
        x=random_activations(x.shape, seed=seed + 1, dtype=x.dtype),
        h_pre=random_activations((b, s, n), seed=seed + 2),
        h_post=random_activations((b, s, n), seed=seed + 3),
        h_res=random_activations((b, s, n, n), seed=seed + 4),
    )
    if use_kernel:
        fn = lambda x, w: pre(x, w, config=CONFIG, kernel=KERNEL)  # noqa: E731
    else:
        fn = lambda x, w: reference.pre(x, w, config=CONFIG)  # noqa: E731
    return jax.jit(lambda x, w: _pre_vjp(fn, x, w, d_li, d_ctx))(x, w)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_pre_forward_and_every_gradient_match_reference(dtype):
    x, w = _inputs(dtype)
    li_k, ctx_k, (dx_k, dw_k) = _run_pre(True, x, w)
    li_r, ctx_r, (dx_r, dw_r) = _run_pre(False, x, w)
    tol = TOL[jnp.dtype(dtype)]
    assert li_k.dtype == li_r.dtype == dtype and li_k.shape == li_r.shape
    assert _rel_err(li_k, li_r) <= tol
    for name in ("h_pre", "h_post", "h_res"):
        a, b = getattr(ctx_k, name), getattr(ctx_r, name)
        assert a.dtype == jnp.float32 and a.shape == b.shape
        assert _rel_err(a, b) <= 2e-6, name
    np.testing.assert_array_equal(np.asarray(ctx_k.x), np.asarray(x))
    assert dx_k.dtype == dtype and _rel_err(dx_k, dx_r) <= tol
    for name in WEIGHT_FIELDS:
        gk, gr, primal = getattr(dw_k, name), getattr(dw_r, name), getattr(w, name)
        assert gk.dtype == primal.dtype and gk.shape == primal.shape, name
        assert _rel_err(gk, gr) <= TOL[jnp.dtype(gk.dtype)], name


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_post_forward_and_every_gradient_match_reference(dtype):
    x, w = _inputs(dtype)
    _, ctx = jax.jit(lambda x, w: reference.pre(x, w, config=CONFIG))(x, w)
    y = random_activations(SHAPE[:2] + SHAPE[3:], seed=5, dtype=dtype)
    g = random_activations(SHAPE, seed=6, dtype=dtype)

    def run(fn):
        out, vjp = jax.vjp(fn, y, ctx)
        return out, vjp(g)

    out_k, (dy_k, dctx_k) = jax.jit(lambda: run(lambda y, c: post(y, c, config=CONFIG, kernel=KERNEL)))()
    out_r, (dy_r, dctx_r) = jax.jit(lambda: run(lambda y, c: reference.post(y, c, config=CONFIG)))()
    tol = TOL[jnp.dtype(dtype)]
    assert out_k.dtype == dtype and out_k.shape == SHAPE
    assert _rel_err(out_k, out_r) <= tol
    assert dy_k.dtype == dtype and _rel_err(dy_k, dy_r) <= tol
    assert _rel_err(dctx_k.x, dctx_r.x) <= tol
    assert _rel_err(dctx_k.h_res, dctx_r.h_res) <= 2e-6
    assert _rel_err(dctx_k.h_post, dctx_r.h_post) <= 2e-6
    assert float(jnp.max(jnp.abs(dctx_k.h_pre))) == 0.0


def test_pre_then_post_gradients_reach_every_leaf_f32():
    """Composite: post's cotangents on the context flow back through pre's kernels."""
    x, w = _inputs(jnp.float32)
    y = random_activations(SHAPE[:2] + SHAPE[3:], seed=5)
    g = random_activations(SHAPE, seed=6)

    def loss(pre_fn, post_fn):
        def f(x, w, y):
            li, ctx = pre_fn(x, w)
            return jnp.sum(post_fn(jnp.tanh(li) + y, ctx) * g)
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(x, w, y)

    gk = loss(lambda x, w: pre(x, w, config=CONFIG, kernel=KERNEL),
              lambda y, c: post(y, c, config=CONFIG, kernel=KERNEL))
    gr = loss(lambda x, w: reference.pre(x, w, config=CONFIG),
              lambda y, c: reference.post(y, c, config=CONFIG))
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(gk)[0], jax.tree.leaves(gr)):
        # Gate-scale gradients are sums with heavy cancellation: looser, still far
        # below a real error (a wrong term moves them by O(1)).
        assert _rel_err(a, b) <= 1e-4, jax.tree_util.keystr(path)
        assert float(jnp.max(jnp.abs(a))) > 0.0, jax.tree_util.keystr(path)


def test_bf16_activations_with_f32_gate_leaves_keep_leaf_dtypes():
    x, _ = _inputs(jnp.bfloat16)
    w = random_weights(CONFIG, seed=3).astype_for_compute(jnp.bfloat16)  # gates stay f32
    assert w.pre_scale.dtype == jnp.float32 and w.pre_alpha.dtype == jnp.bfloat16
    _, _, (_, dw) = _run_pre(True, x, w)
    for name in WEIGHT_FIELDS:
        assert getattr(dw, name).dtype == getattr(w, name).dtype, name


def test_fault_in_kernel_gate_is_detected(monkeypatch):
    """The comparison can fail: a perturbed gate bound in the kernel module is caught."""
    x, w = _inputs(jnp.float32)
    li_r, ctx_r, _ = _run_pre(False, x, w)

    def biased_gate(logits, scale, bias, **kw):
        return compute_sigmoid_gate(logits, scale, bias.astype(jnp.bfloat16), **kw)

    monkeypatch.setattr(kernel_forward, "compute_sigmoid_gate", biased_gate)
    li_k, ctx_k, _ = _run_pre(True, x, w, seed=10)
    assert _rel_err(ctx_k.h_pre, ctx_r.h_pre) > 1e-4


def test_permutation_constant_is_not_a_traced_argument():
    # The permutation matrices enter the kernel as a compile-time constant: the jitted
    # program's only inputs are x and the weight leaves.
    x, w = _inputs(jnp.float32)
    jaxpr = jax.make_jaxpr(lambda x, w: pre(x, w, config=CONFIG, kernel=KERNEL))(x, w)
    assert len(jaxpr.in_avals) == 1 + len(WEIGHT_FIELDS)


# ------------------------------------------------------------------ unsupported inputs


def _expect_unsupported(match, fn):
    with pytest.raises(UnsupportedInputError, match=match):
        fn()


def test_sinkhorn_variant_is_unsupported():
    cfg = MhcConfig(4, 128, variant="sinkhorn")
    x, w = random_activations(SHAPE), random_weights(cfg)
    _expect_unsupported("only the 'lite' variant", lambda: pre(x, w, config=cfg, kernel=KERNEL))


def test_embedding_not_multiple_of_128_is_unsupported():
    cfg = MhcConfig(4, 96)
    x, w = random_activations((2, 32, 4, 96)), random_weights(cfg)
    _expect_unsupported("multiple of 128", lambda: pre(x, w, config=cfg, kernel=KERNEL))


def test_float16_activations_are_unsupported():
    x, w = _inputs(jnp.float32)
    _expect_unsupported("float16", lambda: pre(x.astype(jnp.float16), w, config=CONFIG, kernel=KERNEL))


def test_tokens_not_divisible_by_block_are_unsupported():
    x = random_activations((2, 20, 4, 128))  # 40 tokens, block 32
    _, w = _inputs(jnp.float32)
    _expect_unsupported(r"divisible by block_tokens=32", lambda: pre(x, w, config=CONFIG, kernel=KERNEL))


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("block_tokens", 12, "block_tokens=12 must be a multiple of 8"),
        ("block_tokens_bwd", 24, r"divisible by block_tokens_bwd=24"),
        ("block_features", 192, "block_features=192"),
        ("block_features", 64, "block_features=64"),
        ("block_tokens", 0, "must be positive"),
    ],
)
def test_bad_block_sizes_are_unsupported(field, value, match):
    x, w = _inputs(jnp.float32)
    kernel = dataclasses.replace(KERNEL, **{field: value})
    cfg = MhcConfig(4, 256) if field == "block_features" else CONFIG
    if field == "block_features":
        x, w = random_activations((2, 32, 4, 256)), random_weights(cfg)
        _, ctx = reference.pre(x, w, config=cfg)
        y = random_activations((2, 32, 256))
        _expect_unsupported(match, lambda: post(y, ctx, config=cfg, kernel=kernel))
    else:
        _expect_unsupported(match, lambda: pre(x, w, config=CONFIG, kernel=kernel))


def test_layer_output_shape_mismatch_is_unsupported():
    x, w = _inputs(jnp.float32)
    _, ctx = reference.pre(x, w, config=CONFIG)
    y = random_activations((2, 16, 128))
    _expect_unsupported("layer_output has shape", lambda: post(y, ctx, config=CONFIG, kernel=KERNEL))


def test_wrong_weight_shape_is_unsupported():
    x, w = _inputs(jnp.float32)
    w = dataclasses.replace(w, pre_bias=jnp.zeros((3,)))
    _expect_unsupported("weight pre_bias has shape", lambda: pre(x, w, config=CONFIG, kernel=KERNEL))
