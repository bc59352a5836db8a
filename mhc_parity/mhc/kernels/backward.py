"""Backward Pallas kernels of mHC-lite: `jax.vjp` of the forward's shared helpers inside the
kernel body, in float32, cast to the primal dtype once when written. `pre_backward` recomputes
the projection per token block and accumulates weight gradients in resident float32 outputs
across a sequential token grid; `post_backward` is the residual mix's cotangent.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from mhc_parity.mhc.common import (
    POST_GATE_MULTIPLIER,
    collapse_streams,
    compute_sigmoid_gate,
    expand_streams,
    folded_rms_projection,
    lite_residual_matrix,
    split_projection,
)
from mhc_parity.mhc.kernels.config import KernelConfig
from mhc_parity.mhc.kernels.forward import permutation_operand, split_streams
from mhc_parity.mhc.kernels.launch import Output, full_block, launch, zero_fill_at_first_step
from mhc_parity.mhc.types import MhcConfig


def _coefficients(proj, gates, perms, config: MhcConfig):
    # Same composition as forward.coefficients, with this module's helper bindings.
    ps, pb, qs, qb, rs, rb = gates
    pre, post, res = split_projection(proj, config.dims)
    h_pre = compute_sigmoid_gate(pre, ps, pb, epsilon=config.pre_epsilon)
    h_post = compute_sigmoid_gate(post, qs, qb, multiplier=POST_GATE_MULTIPLIER)
    h_res = lite_residual_matrix(res, rs, rb, config.streams, perms, matmul_precision=config.matmul_precision)
    return h_pre, h_post, h_res


def accumulate(ref, value) -> None:
    """Add a token block's float32 weight-gradient partial (a seam the fault catalogue patches)."""
    ref[...] += value


def _pre_backward_kernel(config: MhcConfig, kernel: KernelConfig):
    n = config.streams

    def body(
        x_ref,
        f_ref,
        perm_ref,
        ps,
        pb,
        qs,
        qb,
        rs,
        rb,
        dli_ref,
        dhpre_ref,
        dhpost_ref,
        dhres_ref,
        dx_ref,
        df_ref,
        dps,
        dpb,
        dqs,
        dqb,
        drs,
        drb,
    ):
        acc_refs = (df_ref, dps, dpb, dqs, dqb, drs, drb)
        zero_fill_at_first_step(kernel, acc_refs)
        # bf16·bf16 products are exact in f32: the recomputed projection equals the forward
        # one up to summation order, and the vjp's transposed matmuls run in f32.
        v32 = x_ref[...].astype(jnp.float32)
        f32 = f_ref[...].astype(jnp.float32)
        perms = perm_ref[...]
        gates = tuple(r[...].astype(jnp.float32) for r in (ps, pb, qs, qb, rs, rb))

        proj, proj_vjp = jax.vjp(
            lambda v, f: folded_rms_projection(v, f, config.rms_epsilon, matmul_precision=config.matmul_precision),
            v32,
            f32,
        )
        (h_pre, _, _), coef_vjp = jax.vjp(lambda p, g: _coefficients(p, g, perms, config), proj, gates)
        x3 = split_streams(v32, n)
        _, collapse_vjp = jax.vjp(collapse_streams, h_pre, x3)
        d_hpre_collapse, d_x3 = collapse_vjp(dli_ref[...].astype(jnp.float32))
        d_proj, d_gates = coef_vjp((dhpre_ref[...] + d_hpre_collapse, dhpost_ref[...], dhres_ref[...]))
        d_v, d_f = proj_vjp(d_proj)
        dx_ref[...] = (d_v + d_x3.reshape(d_v.shape)).astype(dx_ref.dtype)
        for ref, val in zip(acc_refs, (d_f, *d_gates)):
            accumulate(ref, val)

    return body


def pre_backward(
    x2, folded, gates, d_li, d_hpre, d_hpost, d_hres, *, config: MhcConfig, kernel: KernelConfig, block: int
):
    """Cotangents of `forward.pre_forward` for T tokens (d_li (T, C); d_hpre, d_hpost (T, n) f32;
    d_hres (T, n, n) f32): d_x2 (T, n·C) x2.dtype, d_folded (n·C, P) f32 and the six gate
    gradients (1, k) f32 in `gate_operands` order, summed over this shard's tokens only."""
    t, nc = x2.shape
    n, c = config.streams, config.embedding
    perms = permutation_operand(n)
    tok = lambda *tail: pl.BlockSpec((block, *tail), lambda i: (i,) + (0,) * len(tail))
    inputs = [(x2, tok(nc)), (folded, full_block(folded.shape)), (perms, full_block(perms.shape))]
    inputs += [(g, full_block(g.shape)) for g in gates]
    inputs += [(d_li, tok(c)), (d_hpre, tok(n)), (d_hpost, tok(n)), (d_hres, tok(n, n))]
    outputs = [Output((t, nc), x2.dtype, tok(nc)), Output(folded.shape, jnp.float32, full_block(folded.shape))]
    outputs += [Output(g.shape, jnp.float32, full_block(g.shape)) for g in gates]
    return launch(
        _pre_backward_kernel(config, kernel),
        name="mhc_pre_backward",
        grid=(t // block,),
        inputs=inputs,
        outputs=outputs,
        like=x2,
        kernel=kernel,
        # The weight-gradient accumulators carry across token steps: sequential.
        semantics=("arbitrary",),
    )


def _post_backward_body(x_ref, hres_ref, hpost_ref, y_ref, g_ref, dx_ref, dhres_ref, dhpost_ref, dy_ref):
    _, vjp = jax.vjp(
        expand_streams,
        hres_ref[...],
        hpost_ref[...],
        x_ref[...].astype(jnp.float32),
        y_ref[...].astype(jnp.float32),
    )
    d_hres, d_hpost, d_x, d_y = vjp(g_ref[...].astype(jnp.float32))
    dx_ref[...] = d_x.astype(dx_ref.dtype)
    dhres_ref[...] = d_hres
    dhpost_ref[...] = d_hpost
    dy_ref[...] = d_y.astype(dy_ref.dtype)


def post_backward(x3, h_res, h_post, y, g, *, kernel: KernelConfig, block: int):
    """Cotangents of `forward.post_forward` for T tokens given g (T, n, C): d_x3 (T, n, C)
    x3.dtype, d_h_res (T, n, n) f32, d_h_post (T, n) f32, d_y (T, C) y.dtype."""
    t, n, c = x3.shape
    tok = lambda *tail: pl.BlockSpec((block, *tail), lambda i: (i,) + (0,) * len(tail))
    inputs = [(x3, tok(n, c)), (h_res, tok(n, n)), (h_post, tok(n)), (y, tok(c)), (g, tok(n, c))]
    outputs = [
        Output((t, n, c), x3.dtype, tok(n, c)),
        Output((t, n, n), jnp.float32, tok(n, n)),
        Output((t, n), jnp.float32, tok(n)),
        Output((t, c), y.dtype, tok(c)),
    ]
    return launch(
        _post_backward_body,
        name="mhc_post_backward",
        grid=(t // block,),
        inputs=inputs,
        outputs=outputs,
        like=x3,
        kernel=kernel,
        semantics=("parallel",),
    )
