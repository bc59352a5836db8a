"""Shared numerics of the mHC layer used by both the reference path and the Pallas kernels
(token-leading `jax.numpy`, so also on VMEM blocks). The float64 oracle deliberately does not
import it: a bug here must show up against the oracle. Consumers bind names with `from ...
import` so a fault injection can patch a helper for one path alone.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc.precision import (
    DEFAULT_MATMUL_PRECISION,
    accumulation_dtype,
    cotangent_dot_precision,
    dot_precision,
)

VARIANTS = ("lite", "sinkhorn")
SUPPORTED_ACTIVATION_DTYPES = (jnp.float32, jnp.bfloat16)

DEFAULT_RMS_EPSILON = 1e-5
DEFAULT_PRE_EPSILON = 1e-6
DEFAULT_SINKHORN_ITERATIONS = 20
POST_GATE_MULTIPLIER = 2.0
# n! permutations grow fast; past 5 streams the permutation mix stops being "lite".
MAX_LITE_STREAMS = 5


class UnsupportedInputError(ValueError):
    """An input the implementation does not support; the message names the constraint."""


@dataclasses.dataclass(frozen=True)
class MhcDims:
    """Static sizes of one mHC layer: n streams of C = embedding; variant "lite" (softmax over
    n! permutations) or "sinkhorn" (n×n Sinkhorn matrix)."""

    streams: int
    embedding: int
    variant: str = "lite"

    @property
    def flat_width(self) -> int:
        return self.streams * self.embedding

    @property
    def residual_width(self) -> int:
        """Columns of `res_alpha`: n! (lite) or n² (sinkhorn)."""
        if self.variant == "lite":
            return math.factorial(self.streams)
        return self.streams * self.streams

    @property
    def projection_width(self) -> int:
        """Columns of the fused projection [pre_alpha | post_alpha | res_alpha]."""
        return 2 * self.streams + self.residual_width

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        n, nc, r = self.streams, self.flat_width, self.residual_width
        res_bias = (r,) if self.variant == "lite" else (n, n)
        return {
            "norm_scale": (nc,),
            "pre_alpha": (nc, n),
            "pre_bias": (n,),
            "pre_scale": (1,),
            "post_alpha": (nc, n),
            "post_bias": (n,),
            "post_scale": (1,),
            "res_alpha": (nc, r),
            "res_bias": res_bias,
            "res_scale": (1,),
        }


def validate_dims(dims: MhcDims) -> None:
    """Raise UnsupportedInputError for sizes no mHC path can handle."""
    if dims.variant not in VARIANTS:
        raise UnsupportedInputError(f"variant must be one of {VARIANTS}, got {dims.variant!r}")
    if dims.streams < 1 or dims.embedding < 1:
        raise UnsupportedInputError(
            f"streams and embedding must be positive, got streams={dims.streams}, embedding={dims.embedding}"
        )
    if dims.variant == "lite" and dims.streams > MAX_LITE_STREAMS:
        raise UnsupportedInputError(
            f"mHC-lite mixes over n! permutations; streams={dims.streams} gives "
            f"{math.factorial(dims.streams)} (at most {MAX_LITE_STREAMS} streams supported)"
        )


def validate_activations(x: jax.Array, dims: MhcDims) -> None:
    """Check `x` is (batch, sequence, streams, embedding) in a supported dtype."""
    if x.ndim != 4:
        raise UnsupportedInputError(
            f"x must have shape (batch, sequence, streams, embedding), got rank {x.ndim} shape {tuple(x.shape)}"
        )
    if tuple(x.shape[2:]) != (dims.streams, dims.embedding):
        raise UnsupportedInputError(
            f"x has (streams, embedding) {tuple(x.shape[2:])}, the layer expects ({dims.streams}, {dims.embedding})"
        )
    if jnp.dtype(x.dtype) not in [jnp.dtype(d) for d in SUPPORTED_ACTIVATION_DTYPES]:
        raise UnsupportedInputError(
            f"activation dtype {jnp.dtype(x.dtype).name} is not supported (float32 or bfloat16)"
        )


def validate_layer_output(layer_output: jax.Array, x: jax.Array) -> None:
    """Check the branch output is (batch, sequence, embedding) of the `pre` input x."""
    expected = (x.shape[0], x.shape[1], x.shape[3])
    if tuple(layer_output.shape) != expected:
        raise UnsupportedInputError(
            f"layer_output has shape {tuple(layer_output.shape)}, expected {expected} "
            f"(batch, sequence, embedding of the pre input)"
        )


@functools.cache
def permutation_matrices(n: int) -> np.ndarray:
    """All n! permutation matrices `P_p = eye(n)[perm_p]` in itertools order: a cached,
    read-only float32 (n!, n, n) NumPy array (a compile-time constant for kernels)."""
    if n < 1:
        raise UnsupportedInputError(f"permutation_matrices needs n >= 1, got {n}")
    eye = np.eye(n, dtype=np.float32)
    mats = np.stack([eye[list(p)] for p in itertools.permutations(range(n))])
    mats.setflags(write=False)
    return mats


def compute_sigmoid_gate(
    logits: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    *,
    multiplier: float = 1.0,
    epsilon: float = 0.0,
) -> jax.Array:
    """`multiplier · sigmoid(scale · logits + bias) + epsilon`: logits (..., n) any float,
    scale (1,), bias (n,) -> float32 (..., n). Each operand is upcast before the affine map:
    rounding scale or bias to bfloat16 first changes the gate (the upstream mismatch)."""
    z = scale.astype(jnp.float32) * logits.astype(jnp.float32) + bias.astype(jnp.float32)
    return multiplier * jax.nn.sigmoid(z) + epsilon


def rms_inverse(v: jax.Array, epsilon: float) -> jax.Array:
    """`rsqrt(mean(v²) + epsilon)` over the last axis, in float32. (..., K) -> (..., 1)."""
    v32 = v.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.mean(v32 * v32, axis=-1, keepdims=True) + epsilon)


def fold_norm_into_projection(norm_scale: jax.Array, alphas: tuple[jax.Array, ...], dtype) -> jax.Array:
    """`norm_scale[:, None] · [alpha_0 | alpha_1 | ...]` formed in float32: (nC,), (nC, k_i)
    -> (nC, Σk_i) in `dtype`, the fused projection's matmul operand (as a production layer folds)."""
    stacked = jnp.concatenate([a.astype(jnp.float32) for a in alphas], axis=-1)
    return (norm_scale.astype(jnp.float32)[:, None] * stacked).astype(dtype)


def matmul(a: jax.Array, b: jax.Array, matmul_precision: str = DEFAULT_MATMUL_PRECISION) -> jax.Array:
    """`a (..., K) @ b (K, N)`, b cast to a's dtype, result in `accumulation_dtype(a.dtype)`.
    Where the VJP's precision differs from the forward's (bfloat16 at "highest"), a custom VJP
    states both."""
    b = b.astype(a.dtype)
    forward = dot_precision(a.dtype, matmul_precision)
    backward = cotangent_dot_precision(a.dtype, matmul_precision)
    if forward == backward:
        return _dot(a, b, forward)
    return _dot_with_cotangent_precision(forward, backward, a, b)


def _dot(a: jax.Array, b: jax.Array, precision) -> jax.Array:
    return jax.lax.dot_general(
        a, b, (((a.ndim - 1,), (0,)), ((), ())), precision=precision, preferred_element_type=accumulation_dtype(a.dtype)
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _dot_with_cotangent_precision(forward, backward, a, b):
    return _dot(a, b, forward)


def _dot_with_cotangent_precision_fwd(forward, backward, a, b):
    return _dot(a, b, forward), (a, b)


def _dot_with_cotangent_precision_bwd(forward, backward, residuals, g):
    # Autodiff's own transposes of the dot, stated at `backward`; linear_transpose traces
    # no forward dot (jax.vjp would trace one at `backward`, which Mosaic rejects).
    a, b = residuals
    (d_a,) = jax.linear_transpose(lambda a_: _dot(a_, b, backward), a)(g)
    (d_b,) = jax.linear_transpose(lambda b_: _dot(a, b_, backward), b)(g)
    return d_a, d_b


_dot_with_cotangent_precision.defvjp(_dot_with_cotangent_precision_fwd, _dot_with_cotangent_precision_bwd)


def folded_rms_projection(
    v: jax.Array, folded: jax.Array, epsilon: float, matmul_precision: str = DEFAULT_MATMUL_PRECISION
) -> jax.Array:
    """`rsqrt(mean(v²)+eps) · (v @ folded)`: v (T, nC), folded (nC, P) in the activation dtype
    -> float32 (T, P)."""
    acc = matmul(v, folded, matmul_precision)
    return rms_inverse(v, epsilon) * acc


def split_projection(proj: jax.Array, dims: MhcDims) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(..., 2n + R) -> pre (..., n), post (..., n), res (..., R)."""
    n = dims.streams
    return proj[..., :n], proj[..., n : 2 * n], proj[..., 2 * n :]


def permutation_mix(
    weights: jax.Array,
    n: int,
    perms: jax.Array | None = None,
    matmul_precision: str = DEFAULT_MATMUL_PRECISION,
) -> jax.Array:
    """`Σ_p weights[..., p] · P_p`: (..., n!) float32 -> (..., n, n) float32. perms: the (n!, n·n)
    matrices, passed only by kernel bodies (which may not capture array constants)."""
    if perms is None:
        perms = jnp.asarray(permutation_matrices(n).reshape(-1, n * n))
    mixed = matmul(weights.astype(jnp.float32), perms, matmul_precision)
    return mixed.reshape(weights.shape[:-1] + (n, n))


def lite_residual_matrix(
    logits: jax.Array,
    scale: jax.Array,
    bias: jax.Array,
    n: int,
    perms: jax.Array | None = None,
    matmul_precision: str = DEFAULT_MATMUL_PRECISION,
) -> jax.Array:
    """mHC-lite `h_res = Σ_p softmax(scale·logits + bias)_p P_p`: logits (..., n!), scale (1,),
    bias (n!,) -> float32 (..., n, n), doubly stochastic by construction."""
    z = scale.astype(jnp.float32) * logits.astype(jnp.float32) + bias.astype(jnp.float32)
    return permutation_mix(jax.nn.softmax(z, axis=-1), n, perms, matmul_precision)


def sinkhorn_residual_matrix(
    logits: jax.Array, scale: jax.Array, bias: jax.Array, n: int, iterations: int
) -> jax.Array:
    """Sinkhorn `h_res` from (..., n²) logits, bias (n, n), in float32 log space -> (..., n, n);
    columns sum to 1, rows to within the iteration residual."""
    z = scale.astype(jnp.float32) * logits.astype(jnp.float32).reshape(logits.shape[:-1] + (n, n))
    z = z + bias.astype(jnp.float32)
    for _ in range(iterations):
        z = z - jax.nn.logsumexp(z, axis=-1, keepdims=True)
        z = z - jax.nn.logsumexp(z, axis=-2, keepdims=True)
    return jnp.exp(z)


def collapse_streams(h_pre: jax.Array, x: jax.Array) -> jax.Array:
    """`layer_input[d] = Σ_s h_pre[s] · x[s, d]` in float32: (..., n), (..., n, C) -> (..., C) x.dtype."""
    acc = jnp.sum(h_pre.astype(jnp.float32)[..., :, None] * x.astype(jnp.float32), axis=-2)
    return acc.astype(x.dtype)


def expand_streams(h_res: jax.Array, h_post: jax.Array, x: jax.Array, layer_output: jax.Array) -> jax.Array:
    """`out[j, d] = Σ_i h_res[i, j] · x[i, d] + h_post[j] · layer_output[d]` in float32: h_res
    (..., n, n), h_post (..., n), x (..., n, C), layer_output (..., C) -> (..., n, C) x.dtype."""
    x32 = x.astype(jnp.float32)
    mixed = jnp.sum(h_res.astype(jnp.float32)[..., :, :, None] * x32[..., :, None, :], axis=-3)
    out = mixed + h_post.astype(jnp.float32)[..., :, None] * layer_output.astype(jnp.float32)[..., None, :]
    return out.astype(x.dtype)


def layer_flops(tokens: int, dims: MhcDims) -> dict[str, int]:
    """Approximate floating-point operations of one forward pass, by stage."""
    n, c, nc, p = dims.streams, dims.embedding, dims.flat_width, dims.projection_width
    return {
        "projection": 2 * tokens * nc * p + 3 * tokens * nc,
        "collapse": 2 * tokens * n * c,
        "expand": 2 * tokens * n * n * c + 2 * tokens * n * c,
    }


def layer_bytes(tokens: int, dims: MhcDims, itemsize: int) -> int:
    """Bytes one forward pass must move at minimum: x read twice, out and layer_input written."""
    n, c = dims.streams, dims.embedding
    return itemsize * tokens * (2 * n * c + n * c + 2 * c)
