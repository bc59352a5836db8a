"""Public kernel path: `pre` and `post` validate, then run `_pre_local` / `_post_local` per
shard (`run_token_sharded`), whose `jax.custom_vjp` forward and backward are the Pallas kernels.
The custom VJP sits inside the shard_map, so its backward sums per-shard weight gradients itself.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from mhc_parity.mhc.common import (
    UnsupportedInputError,
    fold_norm_into_projection,
    validate_activations,
    validate_layer_output,
)
from mhc_parity.mhc.kernels import backward, forward
from mhc_parity.mhc.kernels.config import LANES, SUBLANES, KernelConfig
from mhc_parity.mhc.kernels.vmem import fit_blocks
from mhc_parity.mhc.sharding import TOKENS, psum_to_primal_vma, run_token_sharded, token_sharding
from mhc_parity.mhc.types import MhcConfig, MhcContext, MhcWeights, validate_weights

# ----------------------------------------------------------------------------- checks


def _check_config(config: MhcConfig) -> None:
    if config.variant != "lite":
        raise UnsupportedInputError(
            f"the Pallas kernels implement only the 'lite' variant, got variant={config.variant!r}"
        )
    if config.embedding % LANES:
        raise UnsupportedInputError(
            f"the Pallas kernels need embedding to be a multiple of {LANES} (one lane-aligned "
            f"slice per stream), got embedding={config.embedding}"
        )


def token_block(tokens: int, requested: int, what: str) -> int:
    """`requested` clamped to `tokens`; UnsupportedInputError unless it divides them and is a
    multiple of 8 or all of them."""
    if requested < 1:
        raise UnsupportedInputError(f"{what} must be positive, got {requested}")
    block = min(requested, tokens)
    if block % SUBLANES and block != tokens:
        raise UnsupportedInputError(
            f"{what}={block} must be a multiple of {SUBLANES} (or all {tokens} tokens of a shard)"
        )
    if tokens % block:
        raise UnsupportedInputError(f"tokens per shard (batch*sequence = {tokens}) must be divisible by {what}={block}")
    return block


def feature_block(embedding: int, requested: int) -> int:
    """The post-apply feature block: `requested` clamped to the embedding; must divide it."""
    block = min(requested, embedding)
    if block < 1 or block % LANES or embedding % block:
        raise UnsupportedInputError(
            f"block_features={requested} must be a positive multiple of {LANES} dividing embedding={embedding}"
        )
    return block


def _check_vma(kernel: KernelConfig) -> bool:
    # The interpret-mode HLO interpreter cannot run under check_vma=True (docs/jax-notes.md);
    # without it the shard_map transpose sums the replicated weights' cotangents.
    return not kernel.interpret


def _local_tokens(plan, batch: int, seq: int) -> int:
    if plan is None:
        return batch * seq
    b, s = plan.local_batch_seq(batch, seq)
    return b * s


def resolved_blocks(
    kernel: KernelConfig, config: MhcConfig, dtype, batch: int, seq: int, shards: tuple[int, int] = (1, 1)
) -> KernelConfig:
    """The blocks `pre` and `post` run on (batch, seq) tokens split into `shards` = (batch,
    sequence) shards, computed without arrays; UnsupportedInputError as the kernels would raise."""
    if batch % shards[0] or seq % shards[1]:
        raise UnsupportedInputError(f"{batch}x{seq} tokens do not split into {shards[0]}x{shards[1]} shards")
    local = (batch // shards[0]) * (seq // shards[1])
    resolved = _resolve_blocks_for(kernel, local, batch * seq, config, dtype)
    return dataclasses.replace(resolved, block_features=feature_block(config.embedding, resolved.block_features))


def _resolve_blocks(kernel: KernelConfig, plan, batch: int, seq: int, config: MhcConfig, dtype) -> KernelConfig:
    """`kernel` with the validated token blocks the per-shard kernels run. Mosaic: clamped to a
    shard's tokens, then fitted to VMEM. Interpret: clamped to the whole batch's tokens, and a
    smaller shard is padded to that block, since XLA CPU rounds differently per block shape
    (docs/jax-notes.md): sharded runs stay bit-identical per token to unsharded ones."""
    return _resolve_blocks_for(kernel, _local_tokens(plan, batch, seq), batch * seq, config, dtype)


def _resolve_blocks_for(kernel: KernelConfig, local: int, tokens: int, config: MhcConfig, dtype) -> KernelConfig:
    """`_resolve_blocks` for `local` tokens per shard of `tokens` in all."""
    resolved = {}
    for field in ("block_tokens", "block_tokens_bwd"):
        requested = getattr(kernel, field)
        if not kernel.interpret:
            resolved[field] = token_block(local, requested, field)
            continue
        block = token_block(tokens, requested, field)
        if block <= local:
            token_block(local, block, field)
        resolved[field] = block
    resolved = dataclasses.replace(kernel, **resolved)
    return resolved if kernel.interpret else fit_blocks(resolved, config, dtype, local)


def _kernel_block(tokens: int, requested: int, what: str, kernel: KernelConfig) -> int:
    """The block a kernel runs on `tokens` local tokens; in interpret mode a larger resolved
    block is kept (the shard is padded to it)."""
    if kernel.interpret and requested > tokens:
        return requested
    return token_block(tokens, requested, what)


def _pad_tokens(a: jax.Array, rows: int, *, zeros: bool) -> jax.Array:
    """Pad token-major `a` (T, ...) to `rows` tokens. zeros: for cotangents (the padding adds
    nothing to weight gradients); else repeat the shard's tokens (zero rows would give
    rsqrt(0) = inf, then NaN, with rms_epsilon=0)."""
    t = a.shape[0]
    if t >= rows:
        return a
    if zeros:
        return jnp.concatenate([a, jnp.zeros((rows - t, *a.shape[1:]), a.dtype)], axis=0)
    return jnp.take(a, jnp.arange(rows) % t, axis=0)


# ------------------------------------------------------------------------- pre (VJP)


def _matmul_leaves(weights: MhcWeights, dtype) -> tuple[jax.Array, ...]:
    """(norm_scale, pre_alpha, post_alpha, res_alpha) rounded to the activation dtype before
    folding, as the reference does (the custom VJP's primal leaves are float32)."""
    return tuple(getattr(weights, f).astype(dtype) for f in ("norm_scale", "pre_alpha", "post_alpha", "res_alpha"))


def _fold_leaves(norm_scale, pre_alpha, post_alpha, res_alpha, dtype) -> jax.Array:
    """(n·C, P) matmul operand [pre|post|res] with the RMS scale folded in, in `dtype`."""
    return fold_norm_into_projection(norm_scale, (pre_alpha, post_alpha, res_alpha), dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _pre_core(config: MhcConfig, kernel: KernelConfig, x2, weights):
    out, _ = _pre_core_fwd(config, kernel, x2, weights)
    return out


def _pre_core_fwd(config, kernel, x2, weights):
    folded = _fold_leaves(*_matmul_leaves(weights, x2.dtype), dtype=x2.dtype)
    t = x2.shape[0]
    block = _kernel_block(t, kernel.block_tokens, "block_tokens", kernel)
    outs = forward.pre_forward(
        _pad_tokens(x2, block, zeros=False),
        folded,
        forward.gate_operands(weights),
        config=config,
        kernel=kernel,
        block=block,
    )
    return tuple(o[:t] for o in outs), (x2, weights, folded)


def _pre_core_bwd(config, kernel, residuals, cotangents):
    x2, weights, folded = residuals
    d_li, d_hpre, d_hpost, d_hres = cotangents
    t = x2.shape[0]
    block = _kernel_block(t, kernel.block_tokens_bwd, "block_tokens_bwd", kernel)
    d_x2, d_folded, *d_gates = backward.pre_backward(
        _pad_tokens(x2, block, zeros=False),
        folded,
        forward.gate_operands(weights),
        *(_pad_tokens(d, block, zeros=True) for d in (d_li, d_hpre, d_hpost, d_hres)),
        config=config,
        kernel=kernel,
        block=block,
    )
    d_x2 = d_x2[:t]
    # Per-shard sums -> whole-batch sums (before the fold VJP: one small all-reduce).
    d_folded = psum_to_primal_vma(d_folded, folded)
    # Back through the fold in float32 at the rounded leaves: the rounding's derivative is
    # the identity, as autodiff takes `astype`'s.
    leaves = tuple(a.astype(jnp.float32) for a in _matmul_leaves(weights, x2.dtype))
    _, fold_vjp = jax.vjp(functools.partial(_fold_leaves, dtype=jnp.float32), *leaves)
    d_ns, d_pa, d_qa, d_ra = (
        g.astype(p.dtype) for g, p in zip(fold_vjp(d_folded), _matmul_leaves(weights, jnp.float32))
    )
    gate_names = ("pre_scale", "pre_bias", "post_scale", "post_bias", "res_scale", "res_bias")
    grads = {"norm_scale": d_ns, "pre_alpha": d_pa, "post_alpha": d_qa, "res_alpha": d_ra}
    for name, g in zip(gate_names, d_gates):
        primal = getattr(weights, name)
        grads[name] = psum_to_primal_vma(g, primal).reshape(primal.shape).astype(primal.dtype)
    return d_x2, MhcWeights.from_dict(grads)


_pre_core.defvjp(_pre_core_fwd, _pre_core_bwd)


def _pre_local(config: MhcConfig, kernel: KernelConfig, x, weights):
    b, s, n, c = x.shape
    li, h_pre, h_post, h_res = _pre_core(config, kernel, x.reshape(b * s, n * c), weights)
    context = MhcContext(
        x=x,
        h_pre=h_pre.reshape(b, s, n),
        h_post=h_post.reshape(b, s, n),
        h_res=h_res.reshape(b, s, n, n),
    )
    return li.reshape(b, s, c), context


def pre(x: jax.Array, weights: MhcWeights, *, config: MhcConfig, kernel: KernelConfig = KernelConfig(), mesh=None):
    """Kernel path of mHC `pre`: x (B, S, n, C) float32 or bfloat16 -> (layer_input (B, S, C)
    x.dtype, MhcContext with float32 h_pre, h_post (B, S, n), h_res (B, S, n, n)). Weights in
    any float dtype. mesh: token-shard over ("data", "fsdp") = (batch, sequence), or None for
    the context mesh if any. Differentiable in x and every weight."""
    _check_config(config)
    validate_activations(x, config.dims)
    validate_weights(weights, config)
    plan = token_sharding(mesh)
    kernel = _resolve_blocks(kernel, plan, x.shape[0], x.shape[1], config, x.dtype)
    # Float32 (exact) weights: per-shard gradients stay float32 until the cross-shard sum,
    # and this cast's autodiff rounds the sum to the stored dtype once.
    weights32 = jax.tree.map(lambda a: a.astype(jnp.float32), weights)
    fn = functools.partial(_pre_local, config, kernel)
    return run_token_sharded(fn, plan, (x,), (weights32,), out_specs=(TOKENS, TOKENS), check_vma=_check_vma(kernel))


# ------------------------------------------------------------------------ post (VJP)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _post_core(config: MhcConfig, kernel: KernelConfig, y2, x3, h_res, h_post):
    out, _ = _post_core_fwd(config, kernel, y2, x3, h_res, h_post)
    return out


def _post_core_fwd(config, kernel, y2, x3, h_res, h_post):
    t = x3.shape[0]
    block = _kernel_block(t, kernel.block_tokens, "block_tokens", kernel)
    bf = feature_block(config.embedding, kernel.block_features)
    out = forward.post_forward(
        *(_pad_tokens(a, block, zeros=False) for a in (x3, h_res, h_post, y2)),
        kernel=kernel,
        block=block,
        block_features=bf,
    )
    return out[:t], (y2, x3, h_res, h_post)


def _post_core_bwd(config, kernel, residuals, g):
    y2, x3, h_res, h_post = residuals
    t = x3.shape[0]
    block = _kernel_block(t, kernel.block_tokens_bwd, "block_tokens_bwd", kernel)
    d_x3, d_hres, d_hpost, d_y2 = backward.post_backward(
        *(_pad_tokens(a, block, zeros=False) for a in (x3, h_res, h_post, y2)),
        _pad_tokens(g, block, zeros=True),
        kernel=kernel,
        block=block,
    )
    return d_y2[:t], d_x3[:t], d_hres[:t], d_hpost[:t]


_post_core.defvjp(_post_core_fwd, _post_core_bwd)


def _post_local(config: MhcConfig, kernel: KernelConfig, layer_output, context: MhcContext):
    b, s, n, c = context.x.shape
    out = _post_core(
        config,
        kernel,
        layer_output.reshape(b * s, c),
        context.x.reshape(b * s, n, c),
        context.h_res.reshape(b * s, n, n),
        context.h_post.reshape(b * s, n),
    )
    return out.reshape(b, s, n, c)


def pre_post_shapes_ok(layer_output, context: MhcContext, config: MhcConfig) -> None:
    """Raise UnsupportedInputError unless `post`'s inputs match each other and `config`."""
    x = context.x
    validate_activations(x, config.dims)
    validate_layer_output(layer_output, x)
    b, s, n, c = x.shape
    expected = {"layer_output": (b, s, c), "h_pre": (b, s, n), "h_post": (b, s, n), "h_res": (b, s, n, n)}
    got = {
        "layer_output": layer_output.shape,
        "h_pre": context.h_pre.shape,
        "h_post": context.h_post.shape,
        "h_res": context.h_res.shape,
    }
    for name, shape in expected.items():
        if tuple(got[name]) != shape:
            raise UnsupportedInputError(f"{name} has shape {tuple(got[name])}, expected {shape}")
    if jnp.dtype(layer_output.dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise UnsupportedInputError(
            f"layer_output dtype {jnp.dtype(layer_output.dtype).name} is not supported (float32 or bfloat16)"
        )
    for name in ("h_pre", "h_post", "h_res"):
        if jnp.dtype(getattr(context, name).dtype) != jnp.dtype(jnp.float32):
            raise UnsupportedInputError(f"context.{name} must be float32, got {getattr(context, name).dtype}")


def post(
    layer_output: jax.Array, context: MhcContext, *, config: MhcConfig, kernel: KernelConfig = KernelConfig(), mesh=None
):
    """Kernel path of mHC `post`: `out = h_resᵀ·x + h_post ⊗ layer_output` per token, (B, S, C)
    -> (B, S, n, C) in x's dtype. h_pre gets a zero cotangent. mesh: as for `pre`."""
    _check_config(config)
    pre_post_shapes_ok(layer_output, context, config)
    plan = token_sharding(mesh)
    kernel = _resolve_blocks(kernel, plan, context.x.shape[0], context.x.shape[1], config, context.x.dtype)
    feature_block(config.embedding, kernel.block_features)
    fn = functools.partial(_post_local, config, kernel)
    return run_token_sharded(fn, plan, (layer_output, context), (), out_specs=TOKENS, check_vma=_check_vma(kernel))
