"""MaxText's mHC layer (`maxtext/layers/mhc.py`) run through its own `__call__`: the fixture's weights in
its parameters, the case's branch as `branch_fn`, an identity `norm_fn`. Its only compared intermediate is
`layer_input`, what it hands the branch."""

from __future__ import annotations

import os
import types

import jax
import jax.numpy as jnp
import maxtext
from flax import nnx
from maxtext.common.common_types import HyperConnectionType
from maxtext.layers.mhc import ManifoldConstrainedHyperConnections

from mhc_parity.maxtext_parity import type_aliases
from mhc_parity.maxtext_parity.envelope import LAYER_BLOCK_DEFAULTS, REFERENCE_ENVELOPE, kernel_envelope
from mhc_parity.maxtext_parity.fixes import (
    REFERENCE_PRECISION_CHOICES,
    GatesInFloat32,
    KernelCalls,
    PreAndPostGatesInFloat32,
    kernel_calls,
    maxtext_rejections,
    permutation_constant,
    runs_interpreted,
)

# This project's weight field -> the parameter path in MaxText's layer.
PARAMETERS = {
    "norm_scale": ("mhc_norm", "scale"),
    "pre_alpha": ("pre_alpha",),
    "pre_bias": ("pre_beta",),
    "pre_scale": ("pre_alpha_scale",),
    "post_alpha": ("post_alpha",),
    "post_bias": ("post_beta",),
    "post_scale": ("post_alpha_scale",),
    "res_alpha": ("res_alpha",),
    "res_bias": ("res_beta",),
    "res_scale": ("res_alpha_scale",),
}
# The layer's config fields for the kernel block sizes (case field -> MaxText's name).
BLOCK_CONFIG_FIELDS = {
    "block_tokens": "mhc_pallas_kernel_fwd_block_size",
    "block_tokens_bwd": "mhc_pallas_kernel_bwd_block_size",
    "block_features": "mhc_pallas_kernel_bwd_feature_block_size",
}


def maxtext_parameters(weights: dict) -> dict:
    nested: dict = {}
    for field, path in PARAMETERS.items():
        level = nested
        for key in path[:-1]:
            level = level.setdefault(key, {})
        level[path[-1]] = weights[field]
    return nested


def layer_config(case, *, kernel: bool, matmul_precision: str) -> types.SimpleNamespace:
    """The config fields MaxText's layer reads, for `case` (mHC-lite, this project's epsilons)."""
    mhc_config = case.mhc_config()
    fields = dict(
        mhc_expansion_rate=case.streams,
        dtype=jnp.dtype(case.dtype),
        weight_dtype=jnp.dtype(case.weight_dtype),
        matmul_precision=matmul_precision,
        enable_mhc_lite=case.variant == "lite",
        sinkhorn_iterations=mhc_config.sinkhorn_iterations,
        normalization_layer_epsilon=mhc_config.rms_epsilon,
        use_mhc_pallas_kernel=kernel,
    )
    fields.update({BLOCK_CONFIG_FIELDS[k]: v for k, v in case.block_sizes.items()})
    return types.SimpleNamespace(**fields)


class LayerPath:
    """One path of MaxText's layer, reference (`kernel=False`) or kernel, as released or fixed; a
    whole-layer implementation whose `build` returns the forward the harness differentiates."""

    variants = ("lite",)
    # How MaxText's code was read other than as written, for the run's environment record.
    source_accommodations = property(lambda self: type_aliases.accommodations())

    def __init__(self, *, kernel: bool, fixed: bool, upstream_pr: bool = False):
        if upstream_pr and (kernel or fixed):
            raise ValueError("the upstream PR's variant is of the released reference path")
        self.kernel = kernel
        self.fixed = fixed
        self.upstream_pr = upstream_pr
        suffix = "-fixed" if fixed else "-upstream-pr" if upstream_pr else ""
        self.name = "maxtext-layer-" + ("kernel" if kernel else "reference") + suffix
        self.partner = ("maxtext-layer-reference" + ("-fixed" if fixed else "")) if kernel else ""
        self.envelope = kernel_envelope(LAYER_BLOCK_DEFAULTS) if kernel else REFERENCE_ENVELOPE
        self.code_root = os.path.dirname(maxtext.__file__)
        self.precision_choices = () if kernel else REFERENCE_PRECISION_CHOICES

    def build(self, case, *, matmul_precision: str, mesh):
        """forward(x, weights, branch_fn) -> (out, {"layer_input": ...}) through the layer's `__call__`."""
        permutation_constant(case.streams)  # fills MaxText's cache of them with a value, before any trace
        layer_class = (
            GatesInFloat32
            if self.fixed
            else PreAndPostGatesInFloat32
            if self.upstream_pr
            else ManifoldConstrainedHyperConnections
        )
        config = layer_config(case, kernel=self.kernel, matmul_precision=matmul_precision)
        # Structure and shapes only: the parameters are the fixture's weights (arguments).
        abstract = nnx.eval_shape(lambda: layer_class(config, case.embedding, mesh, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        calls = KernelCalls(
            interpret=runs_interpreted(mesh),
            constant_permutations=self.fixed,
            mesh=mesh if self.fixed else None,
            float32_permutation_mix=self.fixed,
        )

        def forward(x, weights, branch_fn):
            values = jax.tree.map(lambda leaf: leaf, state)
            nnx.replace_by_pure_dict(values, maxtext_parameters(weights))
            layer = nnx.merge(graphdef, values)
            seen = {}

            def branch(inputs):
                seen["layer_input"] = inputs
                return branch_fn(inputs)

            with kernel_calls(calls), maxtext_rejections():
                out, _metadata = layer(lambda h: h, branch, x, HyperConnectionType.MLP_DENSE)
            return out, seen

        return forward
