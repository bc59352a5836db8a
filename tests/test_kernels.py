"""Kernel-specific checks of the Pallas kernels (interpret mode): what the whole layer does not
exercise, leaf dtypes, the compiled program's inputs, and the inputs they reject.

The kernels' forward, intermediates and VJP inside the layer, against the reference and
the oracle, are the shared implementation checks (tests/implementation_base.py,
`TestInterpret`). Every numerical bound here comes from the tolerance policy.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhc_parity.harness.engine.leaves import leaf_kind, weight_leaf
from mhc_parity.harness.judging.metrics import leaf_metrics
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.mhc import oracle, reference
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.kernels import KernelConfig, post, pre
from mhc_parity.mhc.types import WEIGHT_FIELDS, MhcConfig, MhcContext
from tests.support import random_activations, random_weights

CONFIG = MhcConfig(4, 128)
KERNEL = KernelConfig(block_tokens=32, block_tokens_bwd=16, block_features=128)
SHAPE = (2, 32, 4, 128)  # 64 tokens: 2 forward blocks, 4 backward blocks


def _inputs(dtype, weight_dtype=None):
    w = random_weights(CONFIG, seed=3).astype_for_compute(weight_dtype or dtype)
    x = random_activations(SHAPE, seed=4, dtype=dtype)
    return x, w


def _context_cotangents(x, seed=10) -> dict:
    """A cotangent on every output of `pre`: layer_input and each context leaf."""
    b, s, n, c = x.shape
    return {
        "layer_input": random_activations((b, s, c), seed=seed, dtype=x.dtype),
        "x": random_activations(x.shape, seed=seed + 1, dtype=x.dtype),
        "h_pre": random_activations((b, s, n), seed=seed + 2),
        "h_post": random_activations((b, s, n), seed=seed + 3),
        "h_res": random_activations((b, s, n, n), seed=seed + 4),
    }


def _run_pre(use_kernel, x, w, cotangents):
    """(layer_input, context, (d_x, d_weights)) of `pre` for `cotangents` (jitted)."""
    if use_kernel:
        fn = lambda x, w: pre(x, w, config=CONFIG, kernel=KERNEL)  # noqa: E731
    else:
        fn = lambda x, w: reference.pre(x, w, config=CONFIG)  # noqa: E731
    d_ctx = MhcContext(
        x=cotangents["x"], h_pre=cotangents["h_pre"], h_post=cotangents["h_post"], h_res=cotangents["h_res"]
    )

    def with_vjp(x, w):
        (li, ctx), vjp = jax.vjp(fn, x, w)
        return li, ctx, vjp((cotangents["layer_input"], d_ctx))

    return jax.jit(with_vjp)(x, w)


@pytest.mark.parametrize(
    "dtype", [jnp.float32, pytest.param(jnp.bfloat16, marks=pytest.mark.slow)], ids=["f32", "bf16"]
)
def test_pre_vjp_of_a_cotangent_on_every_context_leaf_passes_the_policy(dtype):
    """The layer sends no cotangent to h_pre (nor, directly, to h_post and h_res); the
    kernel's `pre` backward must still handle one like the reference: each gradient is
    held to the policy's vs_reference bound against the float64 VJP of `pre`."""
    x, w = _inputs(dtype)
    cotangents = _context_cotangents(x)
    _, _, (dx_k, dw_k) = _run_pre(True, x, w, cotangents)
    _, _, (dx_r, dw_r) = _run_pre(False, x, w, cotangents)
    dx_o, dw_o = oracle.pre_vjp(x, w, CONFIG, cotangents)
    policy = load_policy()
    leaves = [("d_x", dx_k, dx_r, dx_o)] + [
        (weight_leaf(name), getattr(dw_k, name), getattr(dw_r, name), dw_o[name]) for name in WEIGHT_FIELDS
    ]
    for leaf, kernel_grad, reference_grad, exact in leaves:
        leaf_dtype = np.dtype(kernel_grad.dtype)
        metrics = leaf_metrics(np.asarray(kernel_grad), np.asarray(reference_grad), exact, dtype=leaf_dtype)
        judgement = policy.judge(
            metrics,
            comparison="vs_reference",
            leaf_kind=leaf_kind(leaf),
            dtype=leaf_dtype,
            act_dtype=jnp.dtype(dtype),
            partitioning="manual",
        )
        assert judgement.verdict == "pass", (leaf, judgement)


def test_post_sends_no_cotangent_to_h_pre():
    x, w = _inputs(jnp.float32)
    _, ctx = jax.jit(lambda x, w: reference.pre(x, w, config=CONFIG))(x, w)
    y = random_activations(SHAPE[:2] + SHAPE[3:], seed=5)
    g = random_activations(SHAPE, seed=6)
    _, vjp = jax.vjp(lambda y, c: post(y, c, config=CONFIG, kernel=KERNEL), y, ctx)
    _, d_ctx = jax.jit(vjp)(g)
    assert float(jnp.max(jnp.abs(d_ctx.h_pre))) == 0.0


def test_bf16_activations_with_f32_gate_leaves_keep_leaf_dtypes():
    x, _ = _inputs(jnp.bfloat16)
    w = random_weights(CONFIG, seed=3).astype_for_compute(jnp.bfloat16)  # gates stay f32
    assert w.pre_scale.dtype == jnp.float32 and w.pre_alpha.dtype == jnp.bfloat16
    _, _, (_, dw) = _run_pre(True, x, w, _context_cotangents(x))
    for name in WEIGHT_FIELDS:
        assert getattr(dw, name).dtype == getattr(w, name).dtype, name


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
    # cast on the host: XLA:CPU capped at SSE4_2 cannot JIT a float16 convert (docs/jax-notes.md)
    x16 = jnp.asarray(np.asarray(x).astype(np.float16))
    _expect_unsupported("float16", lambda: pre(x16, w, config=CONFIG, kernel=KERNEL))


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
