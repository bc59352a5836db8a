"""A path's forward from this project's layer, behind the same `build(case, *, matmul_precision,
mesh) -> forward` a whole-layer external implementation serves."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from flax import nnx

from mhc_parity.mhc.kernels import KernelConfig
from mhc_parity.mhc.layer import ManifoldConstrainedHyperConnections
from mhc_parity.mhc.types import MhcWeights


@dataclasses.dataclass(frozen=True)
class LayerBuilder:
    """This project's layer on the reference path, on the Pallas kernels (`kernel`, in
    interpret mode or Mosaic-compiled) or around an external pre/post `implementation`."""

    kernel: bool = False
    interpret: bool = True
    implementation: Any = None

    def build(self, case, *, matmul_precision: str, mesh):
        """`forward(x, weights, branch_fn) -> (out, intermediates)` for `case`'s shapes and
        dtypes: x (B, S, n, C), weights by `MhcWeights` field name, `branch_fn(layer_input)
        -> layer_output`. mesh: the kernels' token-sharding mesh (None unsharded)."""
        options: dict[str, Any]
        if self.implementation is not None:
            options = {"implementation": self.implementation}
        else:
            options = {"use_pallas_kernel": self.kernel}
        if self.kernel:
            options["kernel_config"] = KernelConfig(interpret=self.interpret, **case.block_sizes)
            options["mesh"] = mesh
        # Shapes only: the program takes the fixture's weights, so real initial parameters
        # (small programs compiled per shape) would be wasted work.
        layer = nnx.eval_shape(
            lambda: ManifoldConstrainedHyperConnections(
                case.streams,
                case.embedding,
                dtype=case.dtype,
                weight_dtype=case.weight_dtype,
                variant=case.variant,
                matmul_precision=matmul_precision,
                rngs=nnx.Rngs(0),
                **options,
            )
        )
        graphdef, state = nnx.split(layer)

        def forward(x, weights, branch_fn):
            weights_state = jax.tree.map(lambda leaf: leaf, state)
            nnx.replace_by_pure_dict(weights_state, MhcWeights.from_dict(weights).as_dict())
            module = nnx.merge(graphdef, weights_state)
            return module.call_with_intermediates(branch_fn, x)

        return forward


def layer_builder(*, kernel: bool, interpret: bool, external: Any = None) -> LayerBuilder:
    """The builder of a built-in path, or of an `external` pre/post implementation."""
    return LayerBuilder(kernel=kernel, interpret=interpret, implementation=external)
