"""Data types shared by every mHC path: weights, static configuration, pre→post context."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from mhc_parity.mhc.common import (
    DEFAULT_PRE_EPSILON,
    DEFAULT_RMS_EPSILON,
    DEFAULT_SINKHORN_ITERATIONS,
    MhcDims,
    UnsupportedInputError,
    validate_dims,
)
from mhc_parity.mhc.precision import DEFAULT_MATMUL_PRECISION, check_matmul_precision

WEIGHT_FIELDS = (
    "norm_scale",
    "pre_alpha",
    "pre_bias",
    "pre_scale",
    "post_alpha",
    "post_bias",
    "post_scale",
    "res_alpha",
    "res_bias",
    "res_scale",
)
# Leaves that feed a matmul (cast to the activation dtype) vs gate parameters (kept in
# their stored dtype: the gate upcasts them to float32 itself).
MATMUL_FIELDS = ("norm_scale", "pre_alpha", "post_alpha", "res_alpha")
GATE_FIELDS = tuple(f for f in WEIGHT_FIELDS if f not in MATMUL_FIELDS)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MhcWeights:
    """Every weight leaf of one mHC layer (n streams, C embedding, R = n! or n²).

    norm_scale (nC,); pre_alpha, post_alpha (nC, n); pre_bias, post_bias (n,);
    pre_scale, post_scale, res_scale (1,); res_alpha (nC, R); res_bias (n!,) for
    mHC-lite or (n, n) for Sinkhorn. Any float dtype; a pytree, so it passes through
    `jax.jit`, `jax.vjp` and `shard_map` as a unit.
    """

    norm_scale: jax.Array
    pre_alpha: jax.Array
    pre_bias: jax.Array
    pre_scale: jax.Array
    post_alpha: jax.Array
    post_bias: jax.Array
    post_scale: jax.Array
    res_alpha: jax.Array
    res_bias: jax.Array
    res_scale: jax.Array

    def as_dict(self) -> dict[str, Any]:
        """Field name -> leaf, in `WEIGHT_FIELDS` order."""
        return {name: getattr(self, name) for name in WEIGHT_FIELDS}

    @classmethod
    def from_dict(cls, leaves: dict[str, Any]) -> MhcWeights:
        """Build from a name -> array mapping; missing or unknown names are an error."""
        missing = [f for f in WEIGHT_FIELDS if f not in leaves]
        unknown = [k for k in leaves if k not in WEIGHT_FIELDS]
        if missing or unknown:
            raise ValueError(f"MhcWeights fields: missing {missing}, unknown {unknown}")
        return cls(**{f: leaves[f] for f in WEIGHT_FIELDS})

    def astype_for_compute(self, dtype) -> MhcWeights:
        """Matmul leaves cast to the compute `dtype`; gate scales and biases unchanged."""
        return dataclasses.replace(self, **{f: getattr(self, f).astype(dtype) for f in MATMUL_FIELDS})


@dataclasses.dataclass(frozen=True)
class MhcConfig:
    """Static configuration of the mHC math (hashable; a `jit` static argument)."""

    streams: int
    embedding: int
    variant: str = "lite"
    rms_epsilon: float = DEFAULT_RMS_EPSILON
    pre_epsilon: float = DEFAULT_PRE_EPSILON
    sinkhorn_iterations: int = DEFAULT_SINKHORN_ITERATIONS
    matmul_precision: str = DEFAULT_MATMUL_PRECISION

    def __post_init__(self):
        validate_dims(self.dims)
        check_matmul_precision(self.matmul_precision)

    @property
    def dims(self) -> MhcDims:
        return MhcDims(self.streams, self.embedding, self.variant)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MhcContext:
    """What `pre` hands to `post`: x (B, S, n, C) activation dtype; float32 h_pre, h_post
    (B, S, n) and h_res (B, S, n, n)."""

    x: jax.Array
    h_pre: jax.Array
    h_post: jax.Array
    h_res: jax.Array


def validate_weights(weights: MhcWeights, config: MhcConfig) -> None:
    """Raise UnsupportedInputError naming the first leaf whose shape or dtype is wrong."""
    expected = config.dims.weight_shapes()
    for name, leaf in weights.as_dict().items():
        shape = tuple(getattr(leaf, "shape", ()))
        if shape != expected[name]:
            raise UnsupportedInputError(
                f"weight {name} has shape {shape}, expected {expected[name]} for "
                f"streams={config.streams}, embedding={config.embedding}, variant={config.variant}"
            )
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            raise UnsupportedInputError(f"weight {name} has dtype {leaf.dtype}, expected a float dtype")
