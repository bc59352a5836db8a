"""The float64 oracle: the mHC-lite (and Sinkhorn) math, written independently.

This module is the ground truth every path is measured against. It deliberately
imports nothing from `mhc.common` (nor anything that computes): if a shared helper
were wrong, the reference and kernel paths would agree with each other and only the
oracle would disagree. It also takes a different route through the same algebra —
the RMS-norm scale is applied to the activations rather than folded into the
projection, the gate is written out as `1 / (1 + exp(-z))`, permutation matrices are
built by index assignment, and Sinkhorn normalises in linear space — so a shared
slip of thought is unlikely to be reproduced.

Inputs are the *already dtype-rounded* arrays a path receives, upcast to float64, so
the oracle measures the arithmetic of a path, not the rounding of its inputs.
Everything runs under `jax.enable_x64` with `jax.vjp` for the gradients, on the host
CPU whatever the default backend (`oracle_device`: TPUs have no float64), with every
matmul at `Precision.HIGHEST`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

# The weight leaf names, spelled out again on purpose (see the module docstring).
_WEIGHT_NAMES = (
    "norm_scale",
    "pre_alpha",
    "pre_bias",
    "pre_scale",
    "post_alpha",
    "post_bias",
    "post_scale",
    "res_alpha",
    "res_bias",
    "res_scale",
)

BranchApply = Callable[[Mapping[str, Any], jax.Array], jax.Array]
# Float64 on the host CPU: full precision, whatever a case's matmul_precision (that
# enters only through the rounding model). What `mhc.precision.dot_precision` gives
# float64; spelled out here because the oracle imports nothing from `mhc`.
_PRECISION = jax.lax.Precision.HIGHEST


def oracle_device():
    """The device the oracle computes on: the host's first CPU device."""
    return jax.devices("cpu")[0]


@dataclasses.dataclass(frozen=True)
class OracleResult:
    """Float64 forward values and gradients of one layer application.

    forward: out (B,S,n,C), layer_input (B,S,C), h_pre (B,S,n), h_post (B,S,n),
      h_res (B,S,n,n), layer_output (B,S,C) — the branch output.
    d_x: (B,S,n,C); d_layer_output: (B,S,C), the cotangent reaching the branch output;
    d_weights: weight field name -> gradient; d_branch: branch parameter -> gradient.
    All NumPy float64.
    """

    forward: dict[str, np.ndarray]
    d_x: np.ndarray
    d_layer_output: np.ndarray
    d_weights: dict[str, np.ndarray]
    d_branch: dict[str, np.ndarray]


def _as_f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _weight_mapping(weights) -> dict[str, np.ndarray]:
    """Accept an `MhcWeights` (duck-typed by field names) or a mapping."""
    if isinstance(weights, Mapping):
        get = weights.__getitem__
    else:
        get = lambda name: getattr(weights, name)  # noqa: E731
    return {name: _as_f64(get(name)) for name in _WEIGHT_NAMES}


def oracle_permutations(n: int) -> np.ndarray:
    """(n!, n, n) float64; matrix p has a one at [i, perm_p[i]], perms in itertools order."""
    perms = list(itertools.permutations(range(n)))
    mats = np.zeros((len(perms), n, n), dtype=np.float64)
    for p, perm in enumerate(perms):
        for row, col in enumerate(perm):
            mats[p, row, col] = 1.0
    return mats


def _sigmoid(z):
    return 1.0 / (1.0 + jnp.exp(-z))


def _sinkhorn_linear(z, iterations: int):
    """Sinkhorn–Knopp on exp(z) in linear space (z shifted by its max for range)."""
    m = jnp.exp(z - jnp.max(z, axis=(-2, -1), keepdims=True))
    for _ in range(iterations):
        m = m / jnp.sum(m, axis=-1, keepdims=True)
        m = m / jnp.sum(m, axis=-2, keepdims=True)
    return m


def _exact(v):
    """The identity: the oracle without rounding noise."""
    return v


@jax.custom_vjp
def _round_both_ways(v, forward_delta, backward_delta):
    """v·(1 + forward_delta); its cotangent g comes back as g·(1 + backward_delta)."""
    return v * (1.0 + forward_delta)


def _round_both_ways_fwd(v, forward_delta, backward_delta):
    return v * (1.0 + forward_delta), (forward_delta, backward_delta)


def _round_both_ways_bwd(residuals, g):
    forward_delta, backward_delta = residuals
    return g * (1.0 + backward_delta), jnp.zeros_like(forward_delta), jnp.zeros_like(backward_delta)


_round_both_ways.defvjp(_round_both_ways_fwd, _round_both_ways_bwd)


class _RoundingNoise:
    """One simulated rounding at a value, and another at its cotangent.

    Called at every input and intermediate of the oracle's forward pass, it multiplies
    the value by (1 + δ) and, independently, the cotangent flowing back through that
    point by (1 + δ'), with δ, δ' uniform in [-u, u]. That is how a finite-precision
    path rounds both passes, so the spread it causes is the error the arithmetic
    explains — including where the math itself cancels (a peaked softmax's VJP
    subtracts nearly equal cotangent terms; a gate-scale gradient sums terms of both
    signs), which plain float64 would otherwise compute exactly.
    """

    def __init__(self, key, unit_roundoff: float):
        self.key, self.unit_roundoff, self.calls = key, unit_roundoff, 0

    def __call__(self, v):
        self.calls += 1  # trace-time counter: independent draws for every call site
        key = jax.random.fold_in(self.key, self.calls)
        forward_key, backward_key = jax.random.split(key)
        u = self.unit_roundoff
        forward_delta = jax.random.uniform(forward_key, v.shape, v.dtype, -u, u)
        backward_delta = jax.random.uniform(backward_key, v.shape, v.dtype, -u, u)
        return _round_both_ways(v, forward_delta, backward_delta)


def _softmax(z, r):
    """softmax over the last axis; its VJP rounds the inner product <a, g> through `r`.

    The VJP is a ⊙ (g − <a, g>): for a peaked softmax the subtraction cancels almost
    completely, so the rounding of <a, g> that every finite-precision path makes is
    amplified by 1 / (1 − max a). Float64 autodiff of exp/sum would not show it.
    """

    @jax.custom_vjp
    def softmax(z_):
        e = jnp.exp(z_ - jnp.max(z_, axis=-1, keepdims=True))
        return e / jnp.sum(e, axis=-1, keepdims=True)

    def forward(z_):
        a = softmax(z_)
        return a, a

    def backward(a, g):
        return (a * (g - r(jnp.sum(a * g, axis=-1, keepdims=True))),)

    softmax.defvjp(forward, backward)
    return softmax(z)


def _coefficients(x, w, config, r=_exact):
    n = config.streams
    batch, seq = x.shape[:2]
    v = x.reshape(batch, seq, -1)
    inv_rms = r(1.0 / jnp.sqrt(jnp.mean(v * v, axis=-1, keepdims=True) + config.rms_epsilon))
    normed = r(v * inv_rms * w["norm_scale"])
    h_pre = r(_sigmoid(r(w["pre_scale"] * r(jnp.matmul(normed, w["pre_alpha"], precision=_PRECISION)) + w["pre_bias"])) + config.pre_epsilon)
    h_post = r(2.0 * _sigmoid(r(w["post_scale"] * r(jnp.matmul(normed, w["post_alpha"], precision=_PRECISION)) + w["post_bias"])))
    z_res = r(w["res_scale"] * r(jnp.matmul(normed, w["res_alpha"], precision=_PRECISION)))
    if config.variant == "lite":
        z = r(z_res + w["res_bias"])
        a = r(_softmax(z, r))
        h_res = r(jnp.einsum("bsp,pij->bsij", a, jnp.asarray(oracle_permutations(n)), precision=_PRECISION))
    else:
        z = r(z_res.reshape(batch, seq, n, n) + w["res_bias"])
        h_res = r(_sinkhorn_linear(z, config.sinkhorn_iterations))
    return h_pre, h_post, h_res


def _pre(x, w, config, r=_exact):
    h_pre, h_post, h_res = _coefficients(x, w, config, r)
    layer_input = r(jnp.einsum("bsn,bsnc->bsc", h_pre, x, precision=_PRECISION))
    return layer_input, (h_pre, h_post, h_res)


def _post(layer_output, x, coeffs, r=_exact):
    _, h_post, h_res = coeffs
    return r(r(jnp.einsum("bsij,bsic->bsjc", h_res, x, precision=_PRECISION)) + h_post[..., None] * layer_output[..., None, :])


@functools.lru_cache(maxsize=None)
def _oracle_program(branch_apply: BranchApply, config, unit_roundoff: float):
    """The jitted float64 forward + VJP for one branch and config (cached: shapes retrace).

    unit_roundoff 0: the exact oracle; > 0: every input and intermediate carries one
    simulated rounding of that size (`_RoundingNoise`), drawn from the `key` argument.
    """

    def program(x, w, p, ct, key):
        r = _RoundingNoise(key, unit_roundoff) if unit_roundoff else _exact
        if unit_roundoff:
            x, ct = r(x), r(ct)
            w = {k: r(v) for k, v in w.items()}
            p = {k: r(v) for k, v in p.items()}

        def whole(x_, w_, p_):
            layer_input, coeffs = _pre(x_, w_, config, r)
            layer_output = r(branch_apply(p_, layer_input))
            out = _post(layer_output, x_, coeffs, r)
            return out, (layer_input, layer_output) + coeffs

        out, pullback, aux = jax.vjp(whole, x, w, p, has_aux=True)
        d_x, d_w, d_p = pullback(ct)
        layer_input, layer_output, h_pre, h_post, h_res = aux
        # The cotangent reaching the branch output: the VJP of `post` w.r.t. its first input.
        _, post_pullback = jax.vjp(lambda y: _post(y, x, (h_pre, h_post, h_res)), layer_output)
        (d_layer_output,) = post_pullback(ct)
        forward = {
            "out": out, "layer_input": layer_input, "h_pre": h_pre, "h_post": h_post,
            "h_res": h_res, "layer_output": layer_output,
        }
        return forward, d_x, d_layer_output, d_w, d_p

    return jax.jit(program)


def run_oracle(
    x,
    weights,
    branch_apply: BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    rounding_noise: tuple[int, float] | None = None,
) -> OracleResult:
    """Forward and VJP of `post(branch(pre(x)))` in float64.

    x: (B, S, n, C) any float dtype (upcast); weights: `MhcWeights` or name -> array;
    branch_apply(params, h) must be dtype-polymorphic jax.numpy (and hashable: the
    compiled program is cached per branch function and config); cotangent: (B,S,n,C)
    seed for the VJP; config: an `MhcConfig` (streams, variant, epsilons, iterations).
    rounding_noise: None for the exact oracle, or (seed, unit_roundoff): every input and
    intermediate is multiplied by (1 + δ), |δ| <= unit_roundoff, to measure how far the
    rounding of a dtype with that unit roundoff moves each leaf.
    """
    seed, unit_roundoff = rounding_noise or (0, 0.0)
    with jax.enable_x64(True), jax.default_device(oracle_device()):
        x64 = jnp.asarray(_as_f64(x))
        w64 = {k: jnp.asarray(v) for k, v in _weight_mapping(weights).items()}
        p64 = {k: jnp.asarray(_as_f64(v)) for k, v in branch_params.items()}
        ct64 = jnp.asarray(_as_f64(cotangent))
        program = _oracle_program(branch_apply, config, float(unit_roundoff))
        forward, d_x, d_layer_output, d_w, d_p = program(x64, w64, p64, ct64, jax.random.key(seed))
        to_np = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
        return OracleResult(
            forward={k: to_np(v) for k, v in forward.items()},
            d_x=to_np(d_x),
            d_layer_output=to_np(d_layer_output),
            d_weights={k: to_np(v) for k, v in d_w.items()},
            d_branch={k: to_np(v) for k, v in d_p.items()},
        )


def oracle_forward(x, weights, layer_output_fn: Callable[[jax.Array], jax.Array], config) -> dict[str, np.ndarray]:
    """Forward values only (float64), for tests that need no gradients."""
    with jax.enable_x64(True), jax.default_device(oracle_device()):
        x64 = jnp.asarray(_as_f64(x))
        w64 = {k: jnp.asarray(v) for k, v in _weight_mapping(weights).items()}
        layer_input, coeffs = _pre(x64, w64, config)
        out = _post(layer_output_fn(layer_input), x64, coeffs)
        return {
            "out": np.asarray(out),
            "layer_input": np.asarray(layer_input),
            "h_pre": np.asarray(coeffs[0]),
            "h_post": np.asarray(coeffs[1]),
            "h_res": np.asarray(coeffs[2]),
        }
