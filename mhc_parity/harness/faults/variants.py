"""Legitimate variants: precision choices production kernels make, which must PASS.

A rule that flags one is as bad as a surviving fault; the kill matrix runs them beside the faults. They keep
the rounding model honest: every place a variant rounds must be a site the model rounds at the activation
dtype.
"""

from __future__ import annotations

import functools
import operator

import jax.numpy as jnp

from mhc_parity.harness.faults.fault_catalogue import (
    INDEPENDENT_IMPLEMENTATIONS,
    KERNEL_IMPLEMENTATIONS,
    REFERENCE_IMPLEMENTATIONS,
)
from mhc_parity.harness.faults.independent_mhc import round_operand
from mhc_parity.harness.faults.model import Patch, Perturbation, Seam
from mhc_parity.mhc.common import matmul, rms_inverse

# Chunks of the projection's K = n·C reduction in `_projection_in_chunks`.
PROJECTION_CHUNKS = 4


def _collapse_with_rounded_weights(original_collapse):
    def collapse_streams_rounded_operand(h_pre, x):
        return original_collapse(round_operand(h_pre, x.dtype), x)

    return collapse_streams_rounded_operand


def _expand_with_rounded_coefficients(original_expand):
    def expand_streams_rounded_operands(h_res, h_post, x, layer_output):
        return original_expand(round_operand(h_res, x.dtype), round_operand(h_post, x.dtype), x, layer_output)

    return expand_streams_rounded_operands


def _projection_in_chunks(original_projection):
    """`folded_rms_projection` whose K reduction runs as PROJECTION_CHUNKS partial float32 sums, as a
    K-tiled matmul does."""

    del original_projection

    def folded_rms_projection_chunked(v, folded, epsilon, matmul_precision="highest"):
        k = v.shape[-1]
        step = k // PROJECTION_CHUNKS if k % PROJECTION_CHUNKS == 0 else k
        partial_sums = [
            matmul(v[..., start : start + step], folded[start : start + step], matmul_precision)
            for start in range(0, k, step)
        ]
        return rms_inverse(v, epsilon) * functools.reduce(operator.add, partial_sums)

    return folded_rms_projection_chunked


def _sigmoid_through_tanh(original_gate):
    def compute_sigmoid_gate_tanh(logits, scale, bias, *, multiplier=1.0, epsilon=0.0):
        z = scale.astype(jnp.float32) * logits.astype(jnp.float32) + bias.astype(jnp.float32)
        return multiplier * 0.5 * (1.0 + jnp.tanh(0.5 * z)) + epsilon

    del original_gate
    return compute_sigmoid_gate_tanh


def _true(original):
    del original
    return True


VARIANTS: tuple[Perturbation, ...] = (
    Perturbation(
        name="reference.coefficient_operands_rounded",
        description="The reference rounds h_pre, h_post and h_res to the activation dtype as "
        "operands of the collapse and the residual mix (float32 accumulation; their cotangents "
        "stay float32).",
        patches=(
            Patch(Seam("mhc_parity.mhc.reference", "collapse_streams"), _collapse_with_rounded_weights),
            Patch(Seam("mhc_parity.mhc.reference", "expand_streams"), _expand_with_rounded_coefficients),
        ),
        implementations=REFERENCE_IMPLEMENTATIONS,
        legitimate=True,
    ),
    Perturbation(
        name="kernel.coefficient_operands_rounded",
        description="The forward kernels feed h_pre, h_post and h_res to the collapse and the "
        "residual mix in the activation dtype (MXU operands, float32 accumulation).",
        patches=(
            Patch(Seam("mhc_parity.mhc.kernels.forward", "collapse_streams"), _collapse_with_rounded_weights),
            Patch(Seam("mhc_parity.mhc.kernels.forward", "expand_streams"), _expand_with_rounded_coefficients),
        ),
        implementations=KERNEL_IMPLEMENTATIONS,
        variants=("lite",),
        legitimate=True,
    ),
    Perturbation(
        name="kernel.projection_accumulated_in_chunks",
        description=f"The forward kernel tiles the projection's K = n*C reduction into "
        f"{PROJECTION_CHUNKS} partial float32 sums (a K-tiled matmul): the same products, "
        f"another order.",
        patches=(Patch(Seam("mhc_parity.mhc.kernels.forward", "folded_rms_projection"), _projection_in_chunks),),
        implementations=KERNEL_IMPLEMENTATIONS,
        variants=("lite",),
        legitimate=True,
    ),
    Perturbation(
        name="kernel.sigmoid_through_tanh",
        description="The forward kernel evaluates sigmoid(z) as (1 + tanh(z/2)) / 2 in float32 "
        "(a common EUP-friendly formula): float32 results an ulp or two apart.",
        patches=(Patch(Seam("mhc_parity.mhc.kernels.forward", "compute_sigmoid_gate"), _sigmoid_through_tanh),),
        implementations=KERNEL_IMPLEMENTATIONS,
        variants=("lite",),
        legitimate=True,
    ),
    Perturbation(
        name="independent.normalised_activations",
        description="An external kernel RMS-normalises the activations, rounds them to the "
        "activation dtype and multiplies by the un-folded weights (instead of folding the norm "
        "scale into the weights).",
        patches=(Patch(Seam("mhc_parity.harness.faults.independent_mhc", "NORMALISE_ACTIVATIONS"), _true),),
        implementations=INDEPENDENT_IMPLEMENTATIONS,
        variants=("lite",),
        legitimate=True,
    ),
)

VARIANTS_BY_NAME = {variant.name: variant for variant in VARIANTS}
