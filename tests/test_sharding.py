"""Token-sharded kernel path vs the unsharded kernel path on 8 simulated CPU devices.

Stated bound. Per token, the sharded and unsharded runs execute the same block
computations (shards split batch × sequence into whole token blocks; a shard smaller
than a block runs one padded block of the same shape), so forward outputs and d_x must
be bit-identical. A weight gradient is a sum over token blocks of
per-block partials p_b; sharding only changes the association of that sum (blocks
within a shard, then across shards) and where the fold VJP's sum over projection
columns happens. For a float32 leaf:

    |g_sharded - g_unsharded| <= 2 · (N_blocks + P) · eps_f32 · Σ_b |p_b|

(the textbook bound for two summation orders of N_blocks + P terms), elementwise;
a bfloat16 leaf may further differ by one rounding: + one ulp of the leaf dtype.
The test measures Σ_b |p_b| by running the kernels on each token block alone.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec

from mhc_parity.harness.env import ISA_CAP, X86_ISA_LEVELS, effective_isa, isa_record
from mhc_parity.mhc.kernels import KernelConfig, post, pre
from mhc_parity.mhc.sharding import psum_to_primal_vma, token_out_shape, token_sharding
from mhc_parity.mhc.types import WEIGHT_FIELDS, MhcConfig
from tests.support import random_activations, random_weights

pytestmark = pytest.mark.sharded

CONFIG = MhcConfig(4, 128)
BLOCK = 8
KERNEL = KernelConfig(block_tokens=BLOCK, block_tokens_bwd=BLOCK, block_features=128)
SHAPE = (8, 16, 4, 128)  # 128 tokens = 16 blocks; 16 tokens per shard on 8 devices
EPS32 = float(np.finfo(np.float32).eps)


def _mesh(shape, axis_type=AxisType.Auto):
    return jax.make_mesh(shape, ("data", "fsdp"), axis_types=(axis_type,) * 2)


def _inputs(dtype):
    b, s, n, c = SHAPE
    w = random_weights(CONFIG, seed=3).astype_for_compute(dtype)
    x = random_activations(SHAPE, seed=4, dtype=dtype)
    y = random_activations((b, s, c), seed=5, dtype=dtype)
    g = random_activations(SHAPE, seed=6, dtype=dtype)
    return x, w, y, g


def _run(mesh, x, w, y, g, kernel=KERNEL):
    """Forward values and (d_x, d_w, d_y) of `post(tanh(pre(x)) + y)` against cotangent g."""
    return _compiled(mesh, kernel)(x, w, y, g)


@functools.cache
def _compiled(mesh, kernel):
    # One jitted program per mesh and kernel mode, so the per-block runs below compile once.
    def fwd(x, w, y):
        li, ctx = pre(x, w, config=CONFIG, kernel=kernel, mesh=mesh)
        return post(jnp.tanh(li) + y, ctx, config=CONFIG, kernel=kernel, mesh=mesh), li, ctx

    def f(x, w, y, g):
        outs, vjp = jax.vjp(fwd, x, w, y)
        ct = (g, jnp.zeros_like(outs[1]), jax.tree.map(jnp.zeros_like, outs[2]))
        return outs, vjp(ct)

    return jax.jit(f)


@functools.cache
def _block_abs_sums_for(dtype_name):
    return _block_abs_sums(*_inputs(jnp.dtype(dtype_name)))


def _block_abs_sums(x, w, y, g):
    """Σ_b |p_b| per weight leaf (float64), p_b = the weight gradient of block b alone."""
    b, s, n, c = SHAPE
    blocks = lambda a: a.reshape((b * s // BLOCK, 1, BLOCK) + a.shape[2:])  # noqa: E731
    xs, ys, gs = blocks(x), blocks(y), blocks(g)
    total = None
    for i in range(xs.shape[0]):
        _, (_, dw, _) = _run(None, xs[i], w, ys[i], gs[i])
        part = {k: np.abs(np.asarray(getattr(dw, k), np.float64)) for k in WEIGHT_FIELDS}
        total = part if total is None else {k: total[k] + part[k] for k in WEIGHT_FIELDS}
    return total


def _assert_identical(a, b, what):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=what)


def _check(mesh_shape, dtype, abs_sums=None, kernel=KERNEL):
    x, w, y, g = _inputs(dtype)
    (out_u, li_u, ctx_u), (dx_u, dw_u, dy_u) = _run(None, x, w, y, g, kernel)
    mesh = _mesh(mesh_shape)
    (out_s, li_s, ctx_s), (dx_s, dw_s, dy_s) = _run(mesh, x, w, y, g, kernel)
    assert out_s.sharding.spec[:2] == PartitionSpec("data", "fsdp")[:2] or mesh_shape != (2, 4)
    for name, a, b in [
        ("out", out_s, out_u),
        ("layer_input", li_s, li_u),
        ("d_x", dx_s, dx_u),
        ("d_layer_output", dy_s, dy_u),
    ] + [(f, getattr(ctx_s, f), getattr(ctx_u, f)) for f in ("h_pre", "h_post", "h_res")]:
        _assert_identical(a, b, name)
    if abs_sums is None:
        abs_sums = _block_abs_sums_for(jnp.dtype(dtype).name)
    n_blocks = SHAPE[0] * SHAPE[1] // BLOCK
    gamma = 2 * (n_blocks + CONFIG.dims.projection_width) * EPS32
    for k in WEIGHT_FIELDS:
        a = np.asarray(getattr(dw_s, k), np.float64)
        b = np.asarray(getattr(dw_u, k), np.float64)
        bound = gamma * abs_sums[k]
        leaf_dtype = getattr(w, k).dtype
        if leaf_dtype != jnp.float32:
            # One ulp of the leaf dtype at the larger of the two values.
            larger = np.maximum(np.abs(a), np.abs(b)).astype(leaf_dtype)
            bound = bound + np.spacing(larger).astype(np.float64)
        assert np.all(np.isfinite(a)), k
        excess = np.abs(a - b) - bound
        assert np.all(excess <= 0), (k, float(np.max(excess)), float(np.max(np.abs(a - b))))
    return abs_sums


@pytest.mark.slow
def test_mosaic_mode_in_the_tpu_interpreter_under_check_vma():
    # The program a TPU runs (per-shard blocks, zero-filled accumulators, check_vma=True,
    # weight gradients summed by psum_to_primal_vma), run by Pallas's TPU interpreter: the
    # same per-token bit-identity and weight-gradient bound as interpret mode.
    tpu_program = dataclasses.replace(KERNEL, interpret=False, tpu_interpreter=True)
    program = str(jax.make_jaxpr(_compiled(_mesh((2, 4)), tpu_program))(*_inputs(jnp.float32)))
    assert "check_vma=True" in program and "check_vma=False" not in program
    assert "psum" in program  # the weight gradients' sum across shards is ours, not the transpose's
    _check((2, 4), jnp.float32, kernel=tpu_program)


@pytest.mark.slow
def test_data2_fsdp4_f32_bit_identical_forward_and_dx_weight_grads_within_bound():
    _check((2, 4), jnp.float32)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(8, 1), (1, 8)])
def test_one_axis_meshes_f32(mesh_shape):
    _check(mesh_shape, jnp.float32)


@pytest.mark.slow
def test_data2_fsdp4_bf16():
    _check((2, 4), jnp.bfloat16)


def test_bound_is_not_vacuous():
    """The weight-gradient bound is far tighter than a real error (e.g. a missing shard)."""
    x, w, y, g = _inputs(jnp.float32)
    _, (_, dw, _) = _run(None, x, w, y, g)
    sums = _block_abs_sums_for("float32")
    gamma = 2 * (SHAPE[0] * SHAPE[1] // BLOCK + CONFIG.dims.projection_width) * EPS32
    for k in WEIGHT_FIELDS:
        # Dropping one shard's eighth of the tokens would change the gradient by ~1/8
        # of its magnitude; the bound must be well below that.
        assert (
            np.max(gamma * sums[k]) < 0.01 * np.max(np.abs(np.asarray(dw_u := getattr(dw, k))))
            or np.max(np.abs(np.asarray(dw_u))) == 0
        ), k


def test_context_mesh_is_used_when_mesh_is_none():
    x, w, _, _ = _inputs(jnp.float32)
    mesh = _mesh((2, 4))
    unsharded = jax.jit(lambda x, w: pre(x, w, config=CONFIG, kernel=KERNEL)[0])(x, w)
    with jax.set_mesh(mesh):
        assert token_sharding(None) is not None
        sharded = jax.jit(lambda x, w: pre(x, w, config=CONFIG, kernel=KERNEL)[0])(x, w)
    assert token_sharding(None) is None
    assert sharded.sharding.spec[:2] == ("data", "fsdp")
    _assert_identical(sharded, unsharded, "layer_input under jax.set_mesh")


def test_explicit_axis_mesh_is_resharded():
    x, w, _, _ = _inputs(jnp.float32)
    ref = jax.jit(lambda x, w: pre(x, w, config=CONFIG, kernel=KERNEL)[0])(x, w)
    out = jax.jit(lambda x, w: pre(x, w, config=CONFIG, kernel=KERNEL, mesh=_mesh((2, 4), AxisType.Explicit))[0])(x, w)
    _assert_identical(out, ref, "explicit-axes mesh")


def test_batch_not_divisible_by_mesh_axis_is_unsupported():
    from mhc_parity.mhc.common import UnsupportedInputError

    x = random_activations((4, 16, 4, 128))
    w = random_weights(CONFIG)
    with pytest.raises(UnsupportedInputError, match="batch divisible by mesh axis 'data'"):
        pre(x, w, config=CONFIG, kernel=KERNEL, mesh=_mesh((8, 1)))


def test_sharding_helpers_inside_check_vma_shard_map():
    """token_out_shape / psum_to_primal_vma carry and remove the token axes' vma."""
    mesh = _mesh((2, 4))
    spec = PartitionSpec(("data", "fsdp"))

    def body(x, w):
        s = token_out_shape(x.shape, x.dtype, x)
        assert s.manual_axis_type.varying == {"data", "fsdp"}
        partial_grad = jax.lax.pcast(w, ("data", "fsdp"), to="varying") * jnp.sum(x)
        return x, psum_to_primal_vma(partial_grad, w)

    x = jnp.arange(64.0).reshape(64, 1)
    w = jnp.ones((1,))
    _, total = jax.jit(
        jax.shard_map(
            body, mesh=mesh, in_specs=(spec, PartitionSpec()), out_specs=(spec, PartitionSpec()), check_vma=True
        )
    )(x, w)
    np.testing.assert_allclose(np.asarray(total), [np.sum(np.arange(64.0))])


# ------------------------------------------------------- through the layer, one program
#
# The tests above call pre and post directly. The harness runs the whole layer
# (pre -> branch -> post, forward and VJP) as one jitted program, where XLA CPU is free
# to fuse across kernels. Two things used to break bit-identity there, each guarded
# below: a one-step interpret grid loop was deleted by XLA and its body fused with its
# neighbours (out and d_x off by an ulp), and a backward block larger than a shard was
# clamped to the shard, so shards compiled a different block shape than the unsharded
# program (d_x off by an ulp).

LAYER_SHAPE = (2, 128, 4, 128)  # 256 tokens: 32 per shard on a (2, 4) mesh
LAYER_TOKEN_LEAVES = ("out", "layer_input", "h_pre", "h_post", "h_res", "d_x")


@functools.cache
def _layer_program(kernel: KernelConfig, mesh_shape, dtype_name):
    """jit(forward + VJP) of the mHC layer with a tanh branch, like mhc_parity.harness.engine.paths builds it."""
    from flax import nnx

    from mhc_parity.mhc.layer import ManifoldConstrainedHyperConnections

    mesh = None if mesh_shape is None else _mesh(mesh_shape)
    layer = ManifoldConstrainedHyperConnections(
        CONFIG.streams,
        CONFIG.embedding,
        dtype=jnp.dtype(dtype_name),
        use_pallas_kernel=True,
        kernel_config=kernel,
        mesh=mesh,
        rngs=nnx.Rngs(0),
    )
    graphdef, state = nnx.split(layer)

    def program(x, weights, cotangent):
        def forward(x_, w_):
            weights_state = jax.tree.map(lambda leaf: leaf, state)
            nnx.replace_by_pure_dict(weights_state, w_)
            return nnx.merge(graphdef, weights_state).call_with_intermediates(jnp.tanh, x_)

        out, pullback, intermediates = jax.vjp(forward, x, weights, has_aux=True)
        d_x, d_w = pullback(cotangent)
        return {"out": out, **intermediates, "d_x": d_x}, d_w

    return jax.jit(program)


def _layer_run(kernel, mesh_shape, dtype):
    x = random_activations(LAYER_SHAPE, seed=11, dtype=dtype)
    g = random_activations(LAYER_SHAPE, seed=12, dtype=dtype)
    weights = random_weights(CONFIG, seed=13).as_dict()
    return _layer_program(kernel, mesh_shape, jnp.dtype(dtype).name)(x, weights, g)


@pytest.mark.parametrize(
    "block_tokens, block_tokens_bwd",
    [
        pytest.param(32, 32, marks=pytest.mark.slow),  # one grid step per shard (8 unsharded)
        (16, 16),  # two grid steps per shard (16 unsharded)
        # Backward block larger than a shard's 32 tokens (4 steps unsharded). XLA CPU
        # compiled the 32- and 64-token backward blocks differently (d_x moved by an
        # ulp), so a shard must run the 64-token block, padded.
        pytest.param(32, 64, marks=pytest.mark.slow),
    ],
    ids=["one-step-per-shard", "multi-step-per-shard", "bwd-block-larger-than-shard"],
)
def test_layer_program_sharded_is_bit_identical_per_token(block_tokens, block_tokens_bwd):
    kernel = KernelConfig(block_tokens=block_tokens, block_tokens_bwd=block_tokens_bwd, block_features=128)
    leaves_u, dw_u = _layer_run(kernel, None, jnp.float32)
    leaves_s, dw_s = _layer_run(kernel, (2, 4), jnp.float32)
    assert leaves_s["out"].sharding.spec[:2] == ("data", "fsdp")
    for name in LAYER_TOKEN_LEAVES:
        _assert_identical(leaves_s[name], leaves_u[name], name)
    # Weight gradients only differ by the association of their sums (bounded tightly in
    # _check); here a loose check that sharding (and the padding rows a shard may run)
    # adds nothing to them.
    for k in WEIGHT_FIELDS:
        a, b = np.asarray(dw_s[k], np.float64), np.asarray(dw_u[k], np.float64)
        assert np.max(np.abs(a - b)) <= 1e-5 * np.max(np.abs(b)), k


def _fused_multiply_adds() -> bool:
    """Whether XLA:CPU may fuse multiply-adds here: it compiles for a level above AVX (a user's
    `--xla_cpu_max_isa`; the harness caps it at AVX otherwise, `mhc_parity.harness.env.required_xla_flags`)."""
    level = isa_record()["xla_cpu_isa"]
    return level in dict(X86_ISA_LEVELS) and effective_isa(ISA_CAP, level, X86_ISA_LEVELS) != level


@pytest.mark.skipif(
    _fused_multiply_adds(),
    reason="bit identity holds at the harness's AVX cap; above it XLA:CPU fuses a block's multiply-adds "
    "but not its tail rows' (AVX512_BF16: d_x 1 ulp off on 1.6% of elements)",
)
@pytest.mark.parametrize(
    "shape, blocks",
    [
        ((2, 32, 2, 128), (8, 128)),  # a shard's 8 tokens padded to the whole 64-token bwd block
        ((8, 16, 2, 128), (16, 16)),  # batch and sequence both split: a shard's tokens in 4 runs
    ],
    ids=["padded-shard", "batch-and-sequence-split"],
)
def test_two_streams_sharded_are_bit_identical_per_token(shape, blocks):
    # Two streams read 2 of the projection's 6 columns per gate: with FMA code XLA's CPU
    # loop over a block's rows rounded the last rows' multiply-adds once and the others
    # twice, so these shards moved by an ulp (mhc_parity.harness.env's --xla_cpu_max_isa).
    config = MhcConfig(2, 128)
    kernel = KernelConfig(block_tokens=blocks[0], block_tokens_bwd=blocks[1], block_features=128)
    x = random_activations(shape, seed=21)
    g = random_activations(shape, seed=22)
    w = random_weights(config, seed=23)

    def run(mesh, x, w):
        def f(x, w):
            li, ctx = pre(x, w, config=config, kernel=kernel, mesh=mesh)
            out = post(li, ctx, config=config, kernel=kernel, mesh=mesh)
            return out, (li, ctx.h_pre, ctx.h_post, ctx.h_res)

        (out, inner), vjp = jax.vjp(f, x, w)
        d_x, _ = vjp((g, jax.tree.map(jnp.zeros_like, inner)))
        return {
            "out": out,
            "layer_input": inner[0],
            "h_pre": inner[1],
            "h_post": inner[2],
            "h_res": inner[3],
            "d_x": d_x,
        }

    unsharded = jax.jit(functools.partial(run, None))(x, w)
    sharded = jax.jit(functools.partial(run, _mesh((2, 4))))(x, w)
    for name in unsharded:
        _assert_identical(sharded[name], unsharded[name], name)


@pytest.mark.slow
def test_layer_program_sharded_bf16_is_bit_identical_per_token():
    kernel = KernelConfig(block_tokens=32, block_tokens_bwd=64, block_features=128)
    leaves_u, _ = _layer_run(kernel, None, jnp.bfloat16)
    leaves_s, _ = _layer_run(kernel, (2, 4), jnp.bfloat16)
    for name in LAYER_TOKEN_LEAVES:
        _assert_identical(leaves_s[name], leaves_u[name], name)
