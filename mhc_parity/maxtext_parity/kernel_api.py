"""MaxText's public mHC kernel API (`maxtext.kernels.mhc.pre/post`) around the case's branch.

As released `pre` cannot run under `jit` + `vjp`; fixed (`maxtext-kernel-fwd-fixed`) it enters at
`mhc_kernels_fwd.pre` with constant permutations. Weights go in as this project's kernels take them; the
context exposes `h_post` and `h_res` (contracted over its first stream index, as here).
"""

from __future__ import annotations

import os

import maxtext
from maxtext.kernels.mhc import api

from mhc_parity.maxtext_parity import lowering, type_aliases
from mhc_parity.maxtext_parity.envelope import api_block_defaults, block_sizes, kernel_envelope
from mhc_parity.maxtext_parity.fixes import KernelCalls, maxtext_rejections, permutation_constant, runs_interpreted
from mhc_parity.mhc.types import MhcWeights

# Case block-size field -> MaxText's MhcKernelConfig field.
CONFIG_FIELDS = {
    "block_tokens": "block_size",
    "block_tokens_bwd": "bwd_block_size",
    "block_features": "bwd_feature_block_size",
}


class KernelApi:
    """MaxText's kernel API, as released (`api.pre`) or fixed (`mhc_parity.maxtext_parity.fixes`)."""

    variants = ("lite",)
    # How MaxText's code was read other than as written, for the run's environment record.
    source_accommodations = property(lambda self: type_aliases.accommodations())

    def __init__(self, *, fixed: bool):
        self.fixed = fixed
        self.name = "maxtext-kernel-fwd-fixed" if fixed else "maxtext-kernel-api"
        self.partner = "maxtext-layer-reference" + ("-fixed" if fixed else "")
        self.envelope = kernel_envelope(api_block_defaults())
        self.code_root = os.path.dirname(maxtext.__file__)

    def kernel_config(self, case, *, interpret: bool):
        """MaxText's `MhcKernelConfig` for `case`: its block sizes and this project's epsilons."""
        mhc_config = case.mhc_config()
        blocks = block_sizes(case, api_block_defaults())
        return api.MhcKernelConfig(
            **{CONFIG_FIELDS[k]: v for k, v in blocks.items()},
            rms_epsilon=mhc_config.rms_epsilon,
            pre_mapping_epsilon=mhc_config.pre_epsilon,
            interpret=interpret,
        )

    def build(self, case, *, matmul_precision: str, mesh):
        """forward(x, weights, branch_fn) -> (out, {layer_input, h_post, h_res})."""
        interpret = runs_interpreted(mesh)
        config = self.kernel_config(case, interpret=interpret)
        calls = KernelCalls(
            interpret=interpret,
            constant_permutations=self.fixed,
            mesh=mesh if self.fixed else None,
            float32_permutation_mix=self.fixed,
        )
        permutations = permutation_constant(case.streams)

        def forward(x, weights, branch_fn):
            kernel_weights = api.MhcWeights(**MhcWeights.from_dict(weights).astype_for_compute(x.dtype).as_dict())
            with maxtext_rejections():
                layer_input, context = calls.pre(x, kernel_weights, permutations, config=config)
                out = calls.post(branch_fn(layer_input), context, config=config)
            return out, {"layer_input": layer_input, "h_post": context.h_post, "h_res": context.residual}

        return forward

    def lower(self, case, mesh_shape: tuple[int, ...]):
        return lowering.lower_programs(self, case, mesh_shape)

    def kernel_programs(self, case, mesh):
        """Its kernel programs on `mesh` (compile-only TPU devices), for the compile rows."""
        return lowering.kernel_programs(self, case, mesh)
