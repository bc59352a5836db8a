"""The reference (non-kernel) path of the mHC layer, in plain JAX (autodiff gradients, XLA
sharding): the fused projection in the activation dtype with float32 accumulation; norms,
gates and softmax in float32 (`mhc_parity.mhc.common`); results in the activation dtype.
"""

from __future__ import annotations

import jax

from mhc_parity.mhc.common import (
    POST_GATE_MULTIPLIER,
    collapse_streams,
    compute_sigmoid_gate,
    expand_streams,
    fold_norm_into_projection,
    folded_rms_projection,
    lite_residual_matrix,
    sinkhorn_residual_matrix,
    split_projection,
    validate_activations,
    validate_layer_output,
)
from mhc_parity.mhc.types import MhcConfig, MhcContext, MhcWeights, validate_weights


def compute_coefficients(
    x: jax.Array, weights: MhcWeights, *, config: MhcConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x (B, S, n, C) activation dtype -> float32 h_pre (B, S, n), h_post (B, S, n), h_res (B, S, n, n)."""
    batch, seq, n, c = x.shape
    folded = fold_norm_into_projection(
        weights.norm_scale, (weights.pre_alpha, weights.post_alpha, weights.res_alpha), x.dtype
    )
    proj = folded_rms_projection(
        x.reshape(batch, seq, n * c), folded, config.rms_epsilon, matmul_precision=config.matmul_precision
    )
    proj_pre, proj_post, proj_res = split_projection(proj, config.dims)
    h_pre = compute_sigmoid_gate(proj_pre, weights.pre_scale, weights.pre_bias, epsilon=config.pre_epsilon)
    h_post = compute_sigmoid_gate(proj_post, weights.post_scale, weights.post_bias, multiplier=POST_GATE_MULTIPLIER)
    if config.variant == "lite":
        h_res = lite_residual_matrix(
            proj_res, weights.res_scale, weights.res_bias, n, matmul_precision=config.matmul_precision
        )
    else:
        h_res = sinkhorn_residual_matrix(proj_res, weights.res_scale, weights.res_bias, n, config.sinkhorn_iterations)
    return h_pre, h_post, h_res


def pre(x: jax.Array, weights: MhcWeights, *, config: MhcConfig) -> tuple[jax.Array, MhcContext]:
    """Collapse the n streams: x (B, S, n, C) float32 or bfloat16 -> layer_input (B, S, C) in
    x.dtype, and the context `post` needs. Weights in any float dtype (matmul leaves are cast to
    x.dtype). UnsupportedInputError for a bad shape or dtype."""
    validate_activations(x, config.dims)
    validate_weights(weights, config)
    weights = weights.astype_for_compute(x.dtype)
    h_pre, h_post, h_res = compute_coefficients(x, weights, config=config)
    layer_input = collapse_streams(h_pre, x)
    return layer_input, MhcContext(x=x, h_pre=h_pre, h_post=h_post, h_res=h_res)


def post(layer_output: jax.Array, context: MhcContext, *, config: MhcConfig) -> jax.Array:
    """Mix the residual streams and add the gated branch output: layer_output (B, S, C) ->
    out (B, S, n, C) in context.x's dtype."""
    validate_layer_output(layer_output, context.x)
    return expand_streams(context.h_res, context.h_post, context.x, layer_output)
