"""The fault catalogue: regressions a kernel author (or a refactor) could plausibly merge.

Each fault patches seams of one path: the reference, the Pallas kernels, or the independent external
implementation. The kill matrix must see each fail some row in each dtype slice, unless its `unkillable_in`
lists the slice: only where its effect there is below what the arithmetic explains.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from mhc_parity.harness.faults.coherent_faults import COHERENT_FAULTS
from mhc_parity.harness.faults.model import BelowBackendShift, Patch, Perturbation, Seam
from mhc_parity.mhc.common import DEFAULT_PRE_EPSILON, matmul, permutation_matrices
from mhc_parity.mhc.precision import DEFAULT_MATMUL_PRECISION

REFERENCE_IMPLEMENTATIONS = ("reference",)
# Built-in implementations that run the Pallas kernels (mosaic only on a TPU).
KERNEL_IMPLEMENTATIONS = ("interpret", "mosaic")
INDEPENDENT_IMPLEMENTATIONS = ("independent",)

# ------------------------------------------------------------------------ replacements
# Each factory takes the original attribute value and returns the faulty one, same signature.


def _gate_with_bf16_params(original_gate):
    def compute_sigmoid_gate_bf16_params(logits, scale, bias, **options):
        return original_gate(logits, scale.astype(jnp.bfloat16), bias.astype(jnp.bfloat16), **options)

    return compute_sigmoid_gate_bf16_params


def _residual_matrix_with_bf16_params(original_matrix):
    def residual_mix_matrix_bf16_params(logits, scale, bias, n):
        return original_matrix(logits, scale.astype(jnp.bfloat16), bias.astype(jnp.bfloat16), n)

    return residual_mix_matrix_bf16_params


# The factor of `_collapse_scaled`: a 10% error in the collapsed branch input.
COLLAPSE_SCALE = 1.1


def _collapse_scaled(original_collapse):
    """`collapse_streams` COLLAPSE_SCALE times too large (a lost or doubled normalisation), in every token,
    in the output's dtype."""

    def collapse_streams_scaled(h_pre, x):
        return (original_collapse(h_pre, x).astype(jnp.float32) * COLLAPSE_SCALE).astype(x.dtype)

    return collapse_streams_scaled


def _gate_without_epsilon(original_gate):
    """The gate ignoring its additive epsilon (only the pre gate passes one)."""

    def compute_sigmoid_gate_no_epsilon(logits, scale, bias, *, multiplier=1.0, epsilon=0.0):
        del epsilon
        return original_gate(logits, scale, bias, multiplier=multiplier, epsilon=0.0)

    return compute_sigmoid_gate_no_epsilon


def _post_gate_multiplier_of_one(original_multiplier):
    del original_multiplier
    return 1.0


def _projection_with_bf16_rms(original_projection):
    """`folded_rms_projection` whose mean of squares and rsqrt run in bfloat16; the matmul is unchanged."""

    del original_projection

    def folded_rms_projection_bf16_stats(v, folded, epsilon, matmul_precision=DEFAULT_MATMUL_PRECISION):
        acc = matmul(v, folded, matmul_precision)
        v16 = v.astype(jnp.bfloat16)
        mean_square = jnp.mean(v16 * v16, axis=-1, keepdims=True, dtype=jnp.bfloat16)
        inverse = jax.lax.rsqrt(mean_square + jnp.asarray(epsilon, jnp.bfloat16))
        return inverse.astype(jnp.float32) * acc

    return folded_rms_projection_bf16_stats


def _reversed_permutations(n: int):
    """The n! permutation matrices in reverse-lexicographic order, (n!, n·n) float32 NumPy."""
    return permutation_matrices(n)[::-1].reshape(-1, n * n).copy()


def _residual_matrix_with_reordered_permutations(original_residual_matrix):
    def lite_residual_matrix_reordered(logits, scale, bias, n, perms=None, **options):
        del perms
        return original_residual_matrix(logits, scale, bias, n, jnp.asarray(_reversed_permutations(n)), **options)

    return lite_residual_matrix_reordered


def _permutation_operand_reordered(original_operand):
    del original_operand
    return _reversed_permutations


def _expand_with_transposed_residual(original_expand):
    def expand_streams_transposed(h_res, h_post, x, layer_output):
        return original_expand(jnp.swapaxes(h_res, -1, -2), h_post, x, layer_output)

    return expand_streams_transposed


def _psum_keeping_first_shard(original_psum):
    """`psum_to_primal_vma` all-reducing only the first token shard's contribution (the others zeroed),
    leaving every device one shard's local weight gradient. Type-correct with and without check_vma; outside
    shard_map it is the original."""

    def psum_to_primal_vma_first_shard_only(grad, primal):
        mesh = jax.sharding.get_abstract_mesh()
        manual = tuple(getattr(mesh, "manual_axes", ()) or ())
        if manual:
            shard = jax.lax.axis_index(manual)
            grad = jnp.where(shard == 0, grad, jnp.zeros_like(grad))
        return original_psum(grad, primal)

    return psum_to_primal_vma_first_shard_only


# Output order of `mhc_parity.mhc.kernels.backward.pre_backward`:
# d_x2, d_folded, pre_scale, pre_bias, post_scale, post_bias, res_scale, res_bias.
_PRE_BACKWARD_POST_BIAS = 5


def _pre_backward_dropping_post_bias_grad(original_pre_backward):
    def pre_backward_without_post_bias_grad(*args, **kwargs):
        outputs = list(original_pre_backward(*args, **kwargs))
        outputs[_PRE_BACKWARD_POST_BIAS] = jnp.zeros_like(outputs[_PRE_BACKWARD_POST_BIAS])
        return outputs

    return pre_backward_without_post_bias_grad


def _launch_skipping_last_token_block(original_launch):
    """`launch` whose kernel body does nothing on the token grid's last step: that block's outputs keep
    their initial contents (zeros in interpret mode, anything on a TPU)."""

    def launch_skipping_last_block(body, *, grid, **kwargs):
        last_step = grid[0] - 1

        def body_skipping_last_block(*refs):
            @pl.when(pl.program_id(0) != last_step)
            def _():
                body(*refs)

        return original_launch(body_skipping_last_block, grid=grid, **kwargs)

    return launch_skipping_last_block


def _zero_fill_at_every_step(original_zero_fill):
    """`zero_fill_at_first_step` zeroing the accumulators at every token step: the weight gradients are the
    last block's alone, so only a backward grid of two or more token blocks shows it."""
    del original_zero_fill

    def zero_fill_at_every_step(kernel, refs, axis=0):
        del kernel, axis
        for r in refs:
            r[...] = jnp.zeros(r.shape, r.dtype)

    return zero_fill_at_every_step


def _vjp_swapping_bias_grads(original_bwd):
    def pre_core_bwd_swapped_bias_grads(config, kernel, residuals, cotangents):
        d_x2, d_weights = original_bwd(config, kernel, residuals, cotangents)
        grads = d_weights.as_dict()
        grads["pre_bias"], grads["post_bias"] = grads["post_bias"], grads["pre_bias"]
        return d_x2, type(d_weights).from_dict(grads)

    return pre_core_bwd_swapped_bias_grads


# ------------------------------------------------------------------------- catalogue

# Measured on the default suite's bfloat16 cases (`mhc-parity faults --cases
# '*-bf16-*'`); the kill matrix prints the current figures for every listed slice.
_EPSILON_BELOW_BFLOAT16 = (
    "bfloat16",
    "the 1e-6 epsilon moves h_pre by ~4e-6 of its size; a correct bfloat16 path's h_pre carries "
    "~1e-3 (its projection operand is rounded to 8 bits), so no bound that passes correct code "
    "can see it",
)
# Measured on the lent TPU v5e (`mhc-parity faults --suite smoke --dtype float32`): a correct
# float32 sigmoid there may err by 1.07e-4 (through softplus; the independent implementation's
# h_post shared 5.7e-5 on every token), a hundred times the epsilon's 1e-6; both epsilon faults
# stayed at usage 0.30 and 0.08 once that shift was in the systematic criterion.
_EPSILON_BELOW_BACKEND_SIGMOID = BelowBackendShift(
    "float32",
    "h_pre",
    DEFAULT_PRE_EPSILON,
    "the backend's own sigmoid may shift h_pre on every token by more than the 1e-6 epsilon",
)
_RMS_STATISTIC_IN_BFLOAT16_NOISE = (
    "bfloat16",
    "a bfloat16 RMS statistic (float32 accumulation) rounds each token's projection once, by "
    "the same relative amount as the bfloat16 operand roundings a correct path makes, and "
    "not the same way for every token: its closest row stays inside the headroom legitimate "
    "bfloat16 variants need (the kill matrix gives its usage)",
)


# The precision faults' own causes (hypothesis names): the gate parameters rounded to bfloat16 (a
# cast's VJP also rounds their gradient; XLA:TPU sums it in bfloat16 itself), and the RMS statistic
# in bfloat16 (rounded, its sum of squares accumulated there, or fitted per token).
_GATE_PARAMETERS_ROUNDED = (
    "round:gate_weight/*:forward:bfloat16",
    "round:gate_weight/*:backward:bfloat16",
    "round:gate_weight/*:cast:bfloat16",
    "round:gate_weight/*:forward:bfloat16:backend_sums",
)
# A kernel rounds them in its forward pass alone where its backward recomputes the gates.
_GATE_PARAMETERS_ROUNDED_FORWARD = (*_GATE_PARAMETERS_ROUNDED, "round:gate_weight/*:recomputed:bfloat16")
_RMS_STATISTIC_ROUNDED = (
    "round:rms_inverse:forward:bfloat16",
    "accumulate:mean_square:value:bfloat16:*",
    "fit:rms_inverse:*",
)


def _reference_fault(
    name,
    attribute,
    description,
    replacement,
    variants=("lite", "sinkhorn"),
    unkillable_in=(),
    below_backend_shift=(),
    causes=(),
) -> Perturbation:
    return Perturbation(
        name=name,
        description=description,
        patches=(Patch(Seam("mhc_parity.mhc.reference", attribute), replacement),),
        implementations=REFERENCE_IMPLEMENTATIONS,
        variants=variants,
        unkillable_in=unkillable_in,
        below_backend_shift=below_backend_shift,
        causes=causes,
    )


def _kernel_fault(
    name,
    module,
    attribute,
    description,
    replacement,
    *,
    sharded_only=False,
    unkillable_in=(),
    below_backend_shift=(),
    causes=(),
) -> Perturbation:
    return Perturbation(
        name=name,
        description=description,
        patches=(Patch(Seam(module, attribute), replacement),),
        implementations=KERNEL_IMPLEMENTATIONS,
        sharded_only=sharded_only,
        variants=("lite",),
        unkillable_in=unkillable_in,
        below_backend_shift=below_backend_shift,
        causes=causes,
    )


CATALOGUE: tuple[Perturbation, ...] = (
    # --- reference path (plain JAX) ------------------------------------------------------
    _reference_fault(
        "reference.gate_params_bf16",
        "compute_sigmoid_gate",
        "The reference casts the gate scale and bias to bfloat16 before the sigmoid (the "
        "upstream reference/kernel mismatch: weights cast to the compute dtype wholesale, "
        "rounding the un-rounded gate leaves).",
        _gate_with_bf16_params,
        causes=_GATE_PARAMETERS_ROUNDED,
    ),
    _reference_fault(
        "reference.pre_epsilon_dropped",
        "compute_sigmoid_gate",
        "The reference's pre gate loses its additive epsilon (h_pre = sigmoid(...) instead of "
        "sigmoid(...) + pre_epsilon), e.g. a refactor that drops a keyword argument.",
        _gate_without_epsilon,
        unkillable_in=(_EPSILON_BELOW_BFLOAT16,),
        below_backend_shift=(_EPSILON_BELOW_BACKEND_SIGMOID,),
    ),
    _reference_fault(
        "reference.post_gate_factor_lost",
        "POST_GATE_MULTIPLIER",
        "The reference's post gate is sigmoid(...) instead of 2*sigmoid(...) (the factor 2 of mHC's h_post lost).",
        _post_gate_multiplier_of_one,
    ),
    _reference_fault(
        "reference.rms_stats_bf16",
        "folded_rms_projection",
        "The reference computes the RMS-norm statistic (mean of squares, rsqrt) in bfloat16 instead of float32.",
        _projection_with_bf16_rms,
        unkillable_in=(_RMS_STATISTIC_IN_BFLOAT16_NOISE,),
        causes=_RMS_STATISTIC_ROUNDED,
    ),
    _reference_fault(
        "reference.layer_input_scaled",
        "collapse_streams",
        f"The reference's collapse returns {COLLAPSE_SCALE} times the stream mix (a normalisation "
        f"lost or applied twice): every branch input {COLLAPSE_SCALE - 1:.0%} too large, which "
        f"cancelling streams hide from the leaf's RMS error.",
        _collapse_scaled,
    ),
    _reference_fault(
        "reference.permutation_order_changed",
        "lite_residual_matrix",
        "The reference mixes the n! permutation matrices in another order than the one the "
        "res_alpha/res_bias columns were trained for (reverse-lexicographic instead of "
        "itertools order).",
        _residual_matrix_with_reordered_permutations,
        variants=("lite",),
    ),
    _reference_fault(
        "reference.residual_contraction_transposed",
        "expand_streams",
        "The reference's residual mix contracts h_res over its second stream index "
        "(out = h_res @ x instead of h_res^T @ x).",
        _expand_with_transposed_residual,
    ),
    # --- Pallas kernels --------------------------------------------------------------------
    _kernel_fault(
        "kernel.gate_params_bf16",
        "mhc_parity.mhc.kernels.forward",
        "compute_sigmoid_gate",
        "The forward kernel casts the gate scale and bias to bfloat16 (e.g. loading the gate "
        "operands in the activation dtype) before the sigmoid.",
        _gate_with_bf16_params,
        causes=_GATE_PARAMETERS_ROUNDED_FORWARD,
    ),
    _kernel_fault(
        "kernel.pre_epsilon_dropped",
        "mhc_parity.mhc.kernels.forward",
        "compute_sigmoid_gate",
        "The forward kernel's pre gate loses its additive epsilon.",
        _gate_without_epsilon,
        unkillable_in=(_EPSILON_BELOW_BFLOAT16,),
        below_backend_shift=(_EPSILON_BELOW_BACKEND_SIGMOID,),
    ),
    _kernel_fault(
        "kernel.post_gate_factor_lost",
        "mhc_parity.mhc.kernels.forward",
        "POST_GATE_MULTIPLIER",
        "The forward kernel's post gate is sigmoid(...) instead of 2*sigmoid(...).",
        _post_gate_multiplier_of_one,
    ),
    _kernel_fault(
        "kernel.rms_stats_bf16",
        "mhc_parity.mhc.kernels.forward",
        "folded_rms_projection",
        "The forward kernel computes the RMS-norm statistic in bfloat16 (squares and mean in "
        "the narrow dtype) instead of float32.",
        _projection_with_bf16_rms,
        unkillable_in=(_RMS_STATISTIC_IN_BFLOAT16_NOISE,),
        causes=_RMS_STATISTIC_ROUNDED,
    ),
    _kernel_fault(
        "kernel.permutation_order_changed",
        "mhc_parity.mhc.kernels.forward",
        "permutation_operand",
        "The forward kernel's permutation-table operand is enumerated in another order than "
        "the reference's (reverse-lexicographic instead of itertools order).",
        _permutation_operand_reordered,
    ),
    _kernel_fault(
        "kernel.residual_contraction_transposed",
        "mhc_parity.mhc.kernels.forward",
        "expand_streams",
        "The post forward kernel contracts h_res over its second stream index (a transposed "
        "einsum / swapped BlockSpec axes).",
        _expand_with_transposed_residual,
    ),
    _kernel_fault(
        "kernel.weight_grad_not_summed",
        "mhc_parity.mhc.kernels.api",
        "psum_to_primal_vma",
        "Token-sharded weight gradients are not summed across shards: every device keeps one "
        "shard's local gradient (a forgotten all-reduce under a replicated out_spec), "
        "type-correct so it yields wrong numbers rather than a crash.",
        _psum_keeping_first_shard,
        sharded_only=True,
    ),
    _kernel_fault(
        "kernel.bias_grad_zeroed",
        "mhc_parity.mhc.kernels.backward",
        "pre_backward",
        "The pre backward kernel never accumulates the post_bias gradient (its accumulator "
        "stays at its zero initial value).",
        _pre_backward_dropping_post_bias_grad,
    ),
    _kernel_fault(
        "kernel.token_block_skipped",
        "mhc_parity.mhc.kernels.forward",
        "launch",
        "The forward kernels skip their last token block (off-by-one in the grid or a "
        "tail guard that drops the final full block); its outputs keep their initial values.",
        _launch_skipping_last_token_block,
    ),
    _kernel_fault(
        "kernel.accumulators_reset_every_block",
        "mhc_parity.mhc.kernels.backward",
        "zero_fill_at_first_step",
        "The pre backward kernel zeroes its weight-gradient accumulators at every token block "
        "instead of only the first (the zero-fill's `pl.when(program_id == 0)` guard lost): "
        "every weight gradient is its last token block's. It errs only after the first token "
        "block, so a case whose backward grid is one block cannot see it.",
        _zero_fill_at_every_step,
    ),
    _kernel_fault(
        "kernel.vjp_bias_grads_swapped",
        "mhc_parity.mhc.kernels.api",
        "_pre_core.bwd",
        "The kernels' custom VJP returns the gradients of pre_bias and post_bias in each "
        "other's place (same shape, so nothing catches it but the numbers).",
        _vjp_swapping_bias_grads,
    ),
    # a leaf scaled by a constant a little off one: the gain's faults
    *COHERENT_FAULTS,
    # --- an external implementation, through the --impl interface --------------------------
    Perturbation(
        name="independent.gate_params_bf16",
        description="The upstream bug in an external kernel that keeps no h_pre: gate scales "
        "and biases rounded to bfloat16 before the sigmoid and the softmax, arithmetic in float32.",
        patches=(
            Patch(Seam("mhc_parity.harness.faults.independent_mhc", "sigmoid_gate"), _gate_with_bf16_params),
            Patch(
                Seam("mhc_parity.harness.faults.independent_mhc", "residual_mix_matrix"),
                _residual_matrix_with_bf16_params,
            ),
        ),
        implementations=INDEPENDENT_IMPLEMENTATIONS,
        variants=("lite",),
        causes=_GATE_PARAMETERS_ROUNDED,
    ),
)

FAULTS = {fault.name: fault for fault in CATALOGUE}
