"""`ManifoldConstrainedHyperConnections`: the mHC layer as a flax.nnx module, wrapping one
branch of a network of n residual streams, on the reference path or the Pallas kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from mhc_parity.mhc import reference
from mhc_parity.mhc.common import (
    DEFAULT_PRE_EPSILON,
    DEFAULT_RMS_EPSILON,
    DEFAULT_SINKHORN_ITERATIONS,
    UnsupportedInputError,
    validate_activations,
)
from mhc_parity.mhc.precision import DEFAULT_MATMUL_PRECISION
from mhc_parity.mhc.types import WEIGHT_FIELDS, MhcConfig, MhcWeights, validate_weights

Initializer = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]

# Small gate scales keep every gate near its bias at initialisation (the papers use 0.01).
INITIAL_GATE_SCALE = 0.01
# Logit advantage of the identity permutation / diagonal: start near a plain residual.
IDENTITY_BIAS_LOGIT = 4.0


def default_initializers(config: MhcConfig) -> dict[str, Initializer]:
    """Per-leaf initialisers following the mHC papers; override any by name."""

    def constant(value):
        return lambda key, shape, dtype: jnp.full(shape, value, dtype)

    def projection(key, shape, dtype):
        return (jax.random.normal(key, shape, jnp.float32) / math.sqrt(shape[0])).astype(dtype)

    def residual_bias(key, shape, dtype):
        if config.variant == "lite":  # permutation 0 is the identity in itertools order
            return jnp.zeros(shape, dtype).at[0].set(IDENTITY_BIAS_LOGIT)
        return (IDENTITY_BIAS_LOGIT * jnp.eye(config.streams)).astype(dtype)

    return {
        "norm_scale": constant(1.0),
        "pre_alpha": projection,
        "pre_bias": constant(0.0),
        "pre_scale": constant(INITIAL_GATE_SCALE),
        "post_alpha": projection,
        "post_bias": constant(0.0),
        "post_scale": constant(INITIAL_GATE_SCALE),
        "res_alpha": projection,
        "res_bias": residual_bias,
        "res_scale": constant(INITIAL_GATE_SCALE),
    }


class ManifoldConstrainedHyperConnections(nnx.Module):
    """The mHC layer: pre → branch → post over n = `streams` residual streams of C = `embedding`.

    dtype: activation dtype, float32 or bfloat16; weight_dtype: parameter storage.
    kernel_config: a `KernelConfig` (None: defaults). mesh: to token-shard the kernels over
    (None: the context mesh, if any). implementation: an object with `pre(x, weights, *,
    config)` and `post(layer_output, context, *, config)` as `mhc_parity.mhc.reference`'s,
    used instead of either built-in path.
    """

    def __init__(
        self,
        streams: int,
        embedding: int,
        *,
        dtype=jnp.float32,
        weight_dtype=jnp.float32,
        variant: str = "lite",
        sinkhorn_iterations: int = DEFAULT_SINKHORN_ITERATIONS,
        rms_epsilon: float = DEFAULT_RMS_EPSILON,
        pre_epsilon: float = DEFAULT_PRE_EPSILON,
        matmul_precision: str = DEFAULT_MATMUL_PRECISION,
        use_pallas_kernel: bool = False,
        kernel_config: Any = None,
        mesh: jax.sharding.Mesh | None = None,
        initializers: Mapping[str, Initializer] | None = None,
        implementation: Any = None,
        rngs: nnx.Rngs,
    ):
        self.config = MhcConfig(
            streams=streams,
            embedding=embedding,
            variant=variant,
            rms_epsilon=rms_epsilon,
            pre_epsilon=pre_epsilon,
            sinkhorn_iterations=sinkhorn_iterations,
            matmul_precision=matmul_precision,
        )
        self.dtype = jnp.dtype(dtype)
        self.weight_dtype = jnp.dtype(weight_dtype)
        self.use_pallas_kernel = use_pallas_kernel
        self.kernel_config = kernel_config
        self.mesh = mesh
        self.implementation = implementation
        inits = default_initializers(self.config)
        unknown = set(initializers or {}) - set(WEIGHT_FIELDS)
        if unknown:
            raise ValueError(f"initializers for unknown weight leaves: {sorted(unknown)}")
        inits.update(initializers or {})
        shapes = self.config.dims.weight_shapes()
        for name in WEIGHT_FIELDS:
            value = inits[name](rngs.params(), shapes[name], self.weight_dtype)
            setattr(self, name, nnx.Param(jnp.asarray(value, self.weight_dtype)))

    def weights(self) -> MhcWeights:
        """Matmul leaves in the compute dtype; gate leaves stored (the gate upcasts them to
        float32 itself; a narrower cast first would round them)."""
        stored = MhcWeights(**{name: getattr(self, name)[...] for name in WEIGHT_FIELDS})
        return stored.astype_for_compute(self.dtype)

    def load_weights(self, weights: MhcWeights) -> None:
        """Overwrite every parameter (cast to `weight_dtype`); shapes are validated."""
        validate_weights(weights, self.config)
        for name, value in weights.as_dict().items():
            getattr(self, name)[...] = jnp.asarray(value, self.weight_dtype)

    def __call__(self, branch_fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
        """x: (B, S, n, C) in `dtype` -> out (B, S, n, C) in `dtype`."""
        out, _ = self.call_with_intermediates(branch_fn, x)
        return out

    def call_with_intermediates(
        self, branch_fn: Callable[[jax.Array], jax.Array], x: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """out (B, S, n, C) and {layer_input (B, S, C) in `dtype`, float32 h_pre, h_post (B, S, n),
        h_res (B, S, n, n)} (an external context gives whichever of the h_* it has)."""
        validate_activations(x, self.config.dims)
        if x.dtype != self.dtype:
            raise UnsupportedInputError(
                f"x has dtype {jnp.dtype(x.dtype).name}, the layer computes in {self.dtype.name}; cast explicitly"
            )
        if self.implementation is not None:
            options = dict(config=self.config)
            pre, post = self.implementation.pre, self.implementation.post
        elif self.use_pallas_kernel:
            from mhc_parity.mhc import kernels  # deferred: the reference path must not need Pallas

            options = dict(config=self.config, mesh=self.mesh)
            if self.kernel_config is not None:
                options["kernel"] = self.kernel_config
            pre, post = kernels.pre, kernels.post
        else:
            options = dict(config=self.config)
            pre, post = reference.pre, reference.post
        layer_input, context = pre(x, self.weights(), **options)
        out = post(branch_fn(layer_input), context, **options)
        intermediates = {"layer_input": layer_input}
        for name in ("h_pre", "h_post", "h_res"):  # an external context may not expose them
            if getattr(context, name, None) is not None:
                intermediates[name] = getattr(context, name)
        return out, intermediates
