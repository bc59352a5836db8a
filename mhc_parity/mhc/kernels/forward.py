"""Forward Pallas kernels of mHC-lite over token blocks (T = tokens of this shard, P = 2n + n!):
`pre_forward` (projection, gates, permutation mix, collapse) and `post_forward` (residual mix
and post gate, tiled over tokens and features). The math is `mhc_parity.mhc.common`'s helpers,
bound here by name so a fault injection can patch them for the kernel path alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from mhc_parity.mhc.common import (
    POST_GATE_MULTIPLIER,
    collapse_streams,
    compute_sigmoid_gate,
    expand_streams,
    folded_rms_projection,
    lite_residual_matrix,
    permutation_matrices,
    split_projection,
)
from mhc_parity.mhc.kernels.config import KernelConfig
from mhc_parity.mhc.kernels.launch import Output, full_block, launch
from mhc_parity.mhc.types import MhcConfig


def permutation_operand(n: int) -> np.ndarray:
    """(n!, n·n) float32 permutation matrices, a kernel input: a Pallas kernel may not capture
    array constants (a compile-time constant, never a differentiated argument)."""
    return permutation_matrices(n).reshape(-1, n * n)


def gate_operands(weights) -> tuple[jax.Array, ...]:
    """Gate parameters as (1, k) operands in their stored dtype (the gates upcast them):
    pre_scale, pre_bias, post_scale, post_bias, res_scale, res_bias."""
    return tuple(
        a.reshape(1, -1)
        for a in (
            weights.pre_scale,
            weights.pre_bias,
            weights.post_scale,
            weights.post_bias,
            weights.res_scale,
            weights.res_bias,
        )
    )


def coefficients(proj, gates, perms, config: MhcConfig):
    """Float32 h_pre (T, n), h_post (T, n), h_res (T, n, n) from a block's projection (T, P)."""
    ps, pb, qs, qb, rs, rb = gates
    pre, post, res = split_projection(proj, config.dims)
    h_pre = compute_sigmoid_gate(pre, ps, pb, epsilon=config.pre_epsilon)
    h_post = compute_sigmoid_gate(post, qs, qb, multiplier=POST_GATE_MULTIPLIER)
    h_res = lite_residual_matrix(res, rs, rb, config.streams, perms, matmul_precision=config.matmul_precision)
    return h_pre, h_post, h_res


def split_streams(v: jax.Array, n: int) -> jax.Array:
    """(T, n·C) -> (T, n, C); C is a multiple of 128, so each stream is lane-aligned."""
    return v.reshape(v.shape[0], n, v.shape[1] // n)


def _pre_forward_kernel(config: MhcConfig):
    def body(x_ref, f_ref, perm_ref, ps, pb, qs, qb, rs, rb, li_ref, hpre_ref, hpost_ref, hres_ref):
        v = x_ref[...]
        proj = folded_rms_projection(v, f_ref[...], config.rms_epsilon, matmul_precision=config.matmul_precision)
        gates = tuple(r[...] for r in (ps, pb, qs, qb, rs, rb))
        h_pre, h_post, h_res = coefficients(proj, gates, perm_ref[...], config)
        li_ref[...] = collapse_streams(h_pre, split_streams(v, config.streams))
        hpre_ref[...] = h_pre
        hpost_ref[...] = h_post
        hres_ref[...] = h_res

    return body


def pre_forward(x2: jax.Array, folded: jax.Array, gates, *, config: MhcConfig, kernel: KernelConfig, block: int):
    """Coefficients + collapse for T tokens. x2: (T, n·C), folded: (n·C, P), both activation
    dtype; block divides T. Returns layer_input (T, C) x2.dtype, float32 h_pre (T, n),
    h_post (T, n), h_res (T, n, n)."""
    t, nc = x2.shape
    n, c = config.streams, config.embedding
    perms = permutation_operand(n)
    tok = lambda *tail: pl.BlockSpec((block, *tail), lambda i: (i,) + (0,) * len(tail))
    inputs = [(x2, tok(nc)), (folded, full_block(folded.shape)), (perms, full_block(perms.shape))]
    inputs += [(g, full_block(g.shape)) for g in gates]
    outputs = [
        Output((t, c), x2.dtype, tok(c)),
        Output((t, n), jnp.float32, tok(n)),
        Output((t, n), jnp.float32, tok(n)),
        Output((t, n, n), jnp.float32, tok(n, n)),
    ]
    return launch(
        _pre_forward_kernel(config),
        name="mhc_pre_forward",
        grid=(t // block,),
        inputs=inputs,
        outputs=outputs,
        like=x2,
        kernel=kernel,
        semantics=("parallel",),
    )


def _post_forward_body(x_ref, hres_ref, hpost_ref, y_ref, out_ref):
    out_ref[...] = expand_streams(hres_ref[...], hpost_ref[...], x_ref[...], y_ref[...])


def post_forward(x3, h_res, h_post, y, *, kernel: KernelConfig, block: int, block_features: int):
    """Residual mix + post gate, tiled (block × block_features): x3 (T, n, C), h_res (T, n, n)
    f32, h_post (T, n) f32, layer output y (T, C) -> (T, n, C) in x3.dtype."""
    t, n, c = x3.shape
    bf = block_features
    inputs = [
        (x3, pl.BlockSpec((block, n, bf), lambda i, j: (i, 0, j))),
        (h_res, pl.BlockSpec((block, n, n), lambda i, j: (i, 0, 0))),
        (h_post, pl.BlockSpec((block, n), lambda i, j: (i, 0))),
        (y, pl.BlockSpec((block, bf), lambda i, j: (i, j))),
    ]
    outputs = [Output((t, n, c), x3.dtype, pl.BlockSpec((block, n, bf), lambda i, j: (i, 0, j)))]
    (out,) = launch(
        _post_forward_body,
        name="mhc_post_forward",
        grid=(t // block, c // bf),
        inputs=inputs,
        outputs=outputs,
        like=x3,
        kernel=kernel,
        semantics=("parallel", "parallel"),
    )
    return out
