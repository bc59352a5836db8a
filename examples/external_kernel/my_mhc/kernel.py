"""A minimal external mHC-lite implementation, checked by mhc-parity.

`pre` is mhc-parity's own reference; `post` is this package's: the residual mix as one
einsum contraction instead of a broadcast-and-sum. The same arithmetic summed in
another order, a correct variant: its rows must pass, and its drift is gated against
its own baseline (baselines/my_mhc.csv).

The interface ("Writing an external implementation" in mhc-parity's
docs/external-implementations.md): `factory()` returns an object with
`pre(x, weights, *, config) -> (layer_input, context)` and
`post(layer_output, context, *, config) -> out`; `name` keys its rows and its baseline.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from mhc_parity.mhc import reference
from mhc_parity.mhc.precision import dot_precision


@dataclasses.dataclass(frozen=True)
class EinsumResidualMix:
    """mHC pre from the reference; post as an einsum (x: (B, S, n, C), h_res: (B, S, n, n))."""

    name: str = "my_mhc"
    variants: tuple[str, ...] = ("lite", "sinkhorn")

    def pre(self, x, weights, *, config):
        return reference.pre(x, weights, config=config)

    def post(self, layer_output, context, *, config):
        x32 = context.x.astype(jnp.float32)
        # out[j, d] = sum_i h_res[i, j] x[i, d] + h_post[j] layer_output[d], in float32
        mixed = jnp.einsum(
            "...ij,...id->...jd", context.h_res, x32, precision=dot_precision(jnp.float32, config.matmul_precision)
        )
        out = mixed + context.h_post[..., None] * layer_output.astype(jnp.float32)[..., None, :]
        return out.astype(context.x.dtype)


def factory() -> EinsumResidualMix:
    return EinsumResidualMix()
