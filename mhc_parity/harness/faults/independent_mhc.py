"""An independent mHC-lite implementation in plain JAX, importing nothing from `mhc`, run as an external
implementation (`--impl mhc_parity.harness.faults.independent_mhc:factory`): the kill matrix injects faults
into its seams, so what catches them is the rules, not knowledge of the internals.

Its precision choices are a production bfloat16 kernel's, all legitimate (no-ops in float32): the norm scale
folded into the weights and rounded once to the activation dtype, float32 accumulation and RMS statistic;
gates and softmax in float32; h_pre, h_post, h_res and the projection's cotangent rounded to the activation
dtype as matmul operands; no h_pre in the context `post` receives. `NORMALISE_ACTIVATIONS` switches to
normalising the activations instead (a legitimate variant).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32
# A seam the legitimate-variant catalogue flips.
NORMALISE_ACTIVATIONS = False


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PostContext:
    """What `pre` hands to `post`: x (B, S, n, C), h_post (B, S, n) f32, h_res (B, S, n, n) f32."""

    x: jax.Array
    h_post: jax.Array
    h_res: jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def round_operand(v: jax.Array, dtype) -> jax.Array:
    """`v` rounded to `dtype` and held in float32; the cotangent passes through unrounded, as a kernel
    rounds an MXU operand and not the gradient flowing back to it."""
    return v.astype(dtype).astype(F32)


def _round_operand_fwd(v, dtype):
    return round_operand(v, dtype), None


def _round_operand_bwd(dtype, _, g):
    return (g,)


round_operand.defvjp(_round_operand_fwd, _round_operand_bwd)


# DEFAULT: the backend's default, e.g. bfloat16 passes on a TPU.
_PRECISIONS = {"highest": jax.lax.Precision.HIGHEST, "default": jax.lax.Precision.DEFAULT}


def precision_of(config) -> jax.lax.Precision:
    """The dot precision a config asks for (an older config without the field: HIGHEST)."""
    return _PRECISIONS[getattr(config, "matmul_precision", "highest")]


def _dot(a: jax.Array, b: jax.Array, precision) -> jax.Array:
    """a (..., K) @ b (K, N) with float32 accumulation at `precision`."""
    return jax.lax.dot_general(
        a,
        b,
        (((a.ndim - 1,), (0,)), ((), ())),
        precision=precision,
        preferred_element_type=F32,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def project(v: jax.Array, weights: jax.Array, precision) -> jax.Array:
    """v (T, K) @ weights (K, P), both in the activation dtype; float32 (T, P). The backward rounds the
    cotangent to the activation dtype, then accumulates both products in float32."""
    return _dot(v, weights, precision)


def _project_fwd(v, weights, precision):
    return project(v, weights, precision), (v, weights)


def _project_bwd(precision, residuals, g):
    v, weights = residuals
    g_operand = g.astype(v.dtype)
    d_v = _dot(g_operand, weights.T, precision).astype(v.dtype)
    d_weights = _dot(v.T, g_operand, precision).astype(weights.dtype)
    return d_v, d_weights


project.defvjp(_project_fwd, _project_bwd)


def rms_inverse(v: jax.Array, epsilon: float) -> jax.Array:
    """rsqrt(mean(v²) + epsilon) over the last axis, from v in float32: (T, K) -> (T, 1)."""
    v32 = v.astype(F32)
    return jax.lax.rsqrt(jnp.mean(v32 * v32, axis=-1, keepdims=True) + epsilon)


def sigmoid_gate(logits, scale, bias, *, multiplier: float = 1.0, epsilon: float = 0.0):
    """multiplier · sigmoid(scale · logits + bias) + epsilon in float32 (scale, bias upcast)."""
    z = scale.astype(F32) * logits + bias.astype(F32)
    # exp(-softplus(-z)): 1 / (1 + exp(-z)) overflows for z < -88 and its gradient is inf / inf.
    return multiplier * jnp.exp(-jnp.logaddexp(0.0, -z)) + epsilon


def permutations(n: int) -> np.ndarray:
    """(n!, n, n) float32: matrix p maps stream i to stream perm_p[i] (itertools order)."""
    perms = list(itertools.permutations(range(n)))
    return np.stack([np.eye(n, dtype=np.float32)[list(p)] for p in perms])


def residual_mix_matrix(logits, scale, bias, n: int):
    """Σ_p softmax(scale · logits + bias)_p P_p in float32: (T, n!) -> (T, n, n); at HIGHEST, as the mix is
    exact at any precision."""
    z = scale.astype(F32) * logits + bias.astype(F32)
    weights = jax.nn.softmax(z, axis=-1)
    return jnp.einsum("tp,pij->tij", weights, permutations(n), precision=jax.lax.Precision.HIGHEST)


def _projection(x2, weights, config):
    """The fused projection (T, 2n + n!) in float32, in the layout `NORMALISE_ACTIVATIONS` picks."""
    alphas = jnp.concatenate([weights.pre_alpha, weights.post_alpha, weights.res_alpha], axis=-1).astype(F32)
    scale = weights.norm_scale.astype(F32)
    inverse = rms_inverse(x2, config.rms_epsilon)
    precision = precision_of(config)
    if NORMALISE_ACTIVATIONS:
        normed = (x2.astype(F32) * inverse * scale).astype(x2.dtype)
        return project(normed, alphas.astype(x2.dtype), precision)
    folded = (scale[:, None] * alphas).astype(x2.dtype)
    return inverse * project(x2, folded, precision)


class IndependentMhcLite:
    """mHC-lite with a production kernel's precision choices (module docstring)."""

    name = "independent"
    variants = ("lite",)

    def pre(self, x, weights, *, config):
        """x (B, S, n, C) -> layer_input (B, S, C) in x.dtype, PostContext."""
        b, s, n, c = x.shape
        x2 = x.reshape(b * s, n * c)
        proj = _projection(x2, weights, config)
        pre_logits, post_logits, res_logits = proj[:, :n], proj[:, n : 2 * n], proj[:, 2 * n :]
        h_pre = sigmoid_gate(pre_logits, weights.pre_scale, weights.pre_bias, epsilon=config.pre_epsilon)
        h_post = sigmoid_gate(post_logits, weights.post_scale, weights.post_bias, multiplier=2.0)
        h_res = residual_mix_matrix(res_logits, weights.res_scale, weights.res_bias, n)
        streams = x2.reshape(b * s, n, c).astype(F32)
        layer_input = jnp.einsum(
            "tn,tnc->tc", round_operand(h_pre, x.dtype), streams, precision=jax.lax.Precision.HIGHEST
        )
        context = PostContext(x=x, h_post=h_post.reshape(b, s, n), h_res=h_res.reshape(b, s, n, n))
        return layer_input.astype(x.dtype).reshape(b, s, c), context

    def post(self, layer_output, context, *, config):
        """out[j] = Σ_i h_res[i, j] x[i] + h_post[j] · layer_output, in x.dtype: (B, S, n, C)."""
        x = context.x
        dtype = x.dtype
        mixed = jnp.einsum(
            "bsij,bsic->bsjc", round_operand(context.h_res, dtype), x.astype(F32), precision=jax.lax.Precision.HIGHEST
        )
        gated = round_operand(context.h_post, dtype)[..., None] * layer_output.astype(F32)[..., None, :]
        return (mixed + gated).astype(dtype)


def factory() -> IndependentMhcLite:
    return IndependentMhcLite()
