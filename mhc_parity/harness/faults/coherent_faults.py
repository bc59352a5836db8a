"""Faults that scale a whole leaf by a constant a little off one: what only the gain sees.

Every element moves by the same relative amount, far below an element's bfloat16 ulp, yet many of the leaf's
rounding spreads along the leaf (`cand_oracle_gain`; docs/judging.md).
"""

from __future__ import annotations

import jax.numpy as jnp

from mhc_parity.harness.faults.model import Patch, Perturbation, Seam

# The factors: 1% of the layer's output (issue 66 item 1), 0.3% of the activation gradient.
OUTPUT_SCALE = 1.01
ACTIVATION_GRAD_SCALE = 1.003


def _scaled(value, factor):
    """`value` times `factor` in float32, back in its own dtype (one rounding, as a kernel's store)."""
    return (value.astype(jnp.float32) * factor).astype(value.dtype)


def _expand_scaled(original_expand):
    def expand_streams_scaled(h_res, h_post, x, layer_output):
        return _scaled(original_expand(h_res, h_post, x, layer_output), OUTPUT_SCALE)

    return expand_streams_scaled


def _first_output_scaled(original_backward):
    def backward_with_scaled_d_x(*args, **kwargs):
        outputs = list(original_backward(*args, **kwargs))
        outputs[0] = _scaled(outputs[0], ACTIVATION_GRAD_SCALE)
        return outputs

    return backward_with_scaled_d_x


_KERNELS = ("interpret", "mosaic")
_BACKWARD = "mhc_parity.mhc.kernels.backward"

COHERENT_FAULTS: tuple[Perturbation, ...] = (
    Perturbation(
        name="kernel.output_scaled_1pct",
        description=f"The post forward kernel's output is {OUTPUT_SCALE} times too large (a constant or "
        "gate multiplier 1% off): under one bfloat16 ulp per element, the same way on every one.",
        patches=(Patch(Seam("mhc_parity.mhc.kernels.forward", "expand_streams"), _expand_scaled),),
        implementations=_KERNELS,
        variants=("lite",),
    ),
    Perturbation(
        name="kernel.activation_grad_scaled",
        description=f"Both backward kernels' d_x parts are {ACTIVATION_GRAD_SCALE} times too large (a "
        "stale loss-scale or normalisation constant): d_x 0.3% off, coherently.",
        patches=(
            Patch(Seam(_BACKWARD, "pre_backward"), _first_output_scaled),
            Patch(Seam(_BACKWARD, "post_backward"), _first_output_scaled),
        ),
        implementations=_KERNELS,
        variants=("lite",),
    ),
)
