"""Run-time changes to MaxText 0.2.5 while this project's paths trace it (never a copy of its code).

* The CPU adaptation (`KernelCalls.interpret`): interpret mode on every kernel call's config, as the
  layer builds it without `interpret`. Not a fix.
* The upstream PR's change alone (`PreAndPostGatesInFloat32`): the pre and post gates in float32.
* The upstream fixes (the `-fixed` implementations): 1. gate scales and biases used in float32
  (`GatesInFloat32`; results cast to the compute dtype as before); 2. the permutation matrices a
  compile-time constant, entering at `mhc_kernels_fwd.pre` (`api.pre`'s `stop_gradient` makes a
  tracer under `jit`); 3. each kernel call token-sharded in a `shard_map` (`check_vma=False`:
  typing MaxText's out_shapes would edit its kernels); 4. the kernels' permutation mix traced at
  `default_matmul_precision("highest")` (Mosaic runs its unstated-precision dot in bfloat16 on a
  TPU v5e; docs/maxtext.md).

While a path traces MaxText (`kernel_calls`), `maxtext.kernels.mhc.api.pre/post` forward to this thread's
`KernelCalls`; elsewhere, and in other threads, they are MaxText's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from maxtext.kernels.mhc import api, common, mhc_kernels_fwd
from maxtext.layers import mhc as maxtext_layer

from mhc_parity.harness.engine.precision_choices import PrecisionChoice
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.sharding import TOKENS, run_token_sharded, token_sharding
from mhc_parity.mhc.types import MATMUL_FIELDS

RELEASED_PRE = api.pre
RELEASED_POST = api.post
ReleasedLayer = maxtext_layer.ManifoldConstrainedHyperConnections

_active = threading.local()
_install_lock = threading.Lock()


def permutation_constant(streams: int) -> np.ndarray:
    """MaxText's own permutation matrices as a NumPy constant, evaluated eagerly: the helper is
    `lru_cache`d, so a first call inside a trace would cache a tracer for every later caller."""
    with jax.ensure_compile_time_eval():
        return np.asarray(maxtext_layer.get_permutation_matrices(streams))


@dataclasses.dataclass(frozen=True)
class KernelCalls:
    """How this thread's MaxText kernel calls run: interpret (no TPU); constant_permutations (fix 2); mesh
    to token-shard over (fix 3; None: bare calls); float32_permutation_mix (fix 4)."""

    interpret: bool
    constant_permutations: bool = False
    mesh: Any = None
    float32_permutation_mix: bool = False

    def _plan(self):
        return None if self.mesh is None else token_sharding(self.mesh)

    def pre(self, x, weights, permutations, *, config=common.MhcKernelConfig(), implementation=None):
        with kernel_calls(self):  # this thread's kernels see fix 4 whoever called (the layer, the API path)
            return self._pre(x, weights, permutations, config=config, implementation=implementation)

    def _pre(self, x, weights, permutations, *, config, implementation):
        config = dataclasses.replace(config, interpret=self.interpret)
        if not self.constant_permutations:
            return RELEASED_PRE(x, weights, permutations, config=config, implementation=implementation)
        constant = _constant(permutations)

        def local(x_, weights_):
            layer_input, context = mhc_kernels_fwd.pre(x_, weights_, constant, config)
            return layer_input, tuple(context)

        layer_input, (x_context, h_post, residual) = run_token_sharded(
            local, self._plan(), (x,), (weights,), (TOKENS, TOKENS), check_vma=False
        )
        return layer_input, api.MhcContext(x=x_context, h_post=h_post, residual=residual, implementation="mosaic")

    def post(self, layer_output, context, *, config=common.MhcKernelConfig()):
        with kernel_calls(self):
            return self._post(layer_output, context, config=config)

    def _post(self, layer_output, context, *, config):
        config = dataclasses.replace(config, interpret=self.interpret)
        plan = self._plan()
        if plan is None:
            return RELEASED_POST(layer_output, context, config=config)

        def local(layer_output_, x_, h_post_, residual_):
            shard = api.MhcContext(x=x_, h_post=h_post_, residual=residual_, implementation=context.implementation)
            return RELEASED_POST(layer_output_, shard, config=config)

        activations = (layer_output, context.x, context.h_post, context.residual)
        return run_token_sharded(local, plan, activations, (), TOKENS, check_vma=False)


def _constant(permutations) -> np.ndarray:
    """The permutations as a NumPy constant: their value, or for the tracer the layer makes under `jit`, the
    same matrices from MaxText's helper."""
    if not isinstance(permutations, jax.core.Tracer):
        return np.asarray(permutations)
    return permutation_constant(permutations.shape[-1]).astype(permutations.dtype)


RELEASED_PERMUTATION_MIX = common.compute_residual_permutations


def _dispatch_permutation_mix(*args, **kwargs):
    calls = getattr(_active, "calls", None)
    if calls is None or not calls.float32_permutation_mix:
        return RELEASED_PERMUTATION_MIX(*args, **kwargs)
    with jax.default_matmul_precision("highest"):
        return RELEASED_PERMUTATION_MIX(*args, **kwargs)


def runs_interpreted(mesh) -> bool:
    """Whether MaxText's kernels run in interpret mode on `mesh`'s devices (None: the device traced for):
    wherever they are not TPUs, also a path on the host CPU beside a chip."""
    if mesh is not None:
        platform = mesh.devices.flat[0].platform
    else:
        device = jax.config.jax_default_device
        platform = jax.default_backend() if device is None else getattr(device, "platform", device)
    return platform != "tpu"


def _dispatch_pre(x, weights, permutations, *, config=common.MhcKernelConfig(), implementation=None):
    calls = getattr(_active, "calls", None)
    if calls is None:
        return RELEASED_PRE(x, weights, permutations, config=config, implementation=implementation)
    return calls.pre(x, weights, permutations, config=config, implementation=implementation)


def _dispatch_post(layer_output, context, *, config=common.MhcKernelConfig()):
    calls = getattr(_active, "calls", None)
    if calls is None:
        return RELEASED_POST(layer_output, context, config=config)
    return calls.post(layer_output, context, config=config)


@contextlib.contextmanager
def kernel_calls(calls: KernelCalls):
    """MaxText's `api.pre/post` and its kernels' permutation mix, run as `calls` says in this thread."""
    with _install_lock:
        api.pre, api.post = _dispatch_pre, _dispatch_post
        common.compute_residual_permutations = _dispatch_permutation_mix
    previous = getattr(_active, "calls", None)
    _active.calls = calls
    try:
        yield
    finally:
        _active.calls = previous


@contextlib.contextmanager
def maxtext_rejections():
    """MaxText's UnsupportedInputError raised as this project's, which the harness judges."""
    try:
        yield
    except common.UnsupportedInputError as exc:
        raise UnsupportedInputError(f"MaxText rejected the input: {exc}") from exc


class _SeenInDtype:
    """A layer whose `dtype` reads as another: MaxText's methods cast gate parameters with `self.dtype`."""

    def __init__(self, layer, dtype):
        self._layer = layer
        self.dtype = dtype

    def __getattr__(self, name):
        return getattr(self._layer, name)


class PreAndPostGatesInFloat32(ReleasedLayer):
    """MaxText's layer with exactly the upstream PR's change: the pre and post gates' `mapping` in float32,
    `res_mapping` as released."""

    def mapping(self, h, alpha_scale, beta, scale, eps=0.0):
        gate = ReleasedLayer.mapping(_SeenInDtype(self, jnp.float32), h, alpha_scale, beta, scale, eps)
        return gate.astype(self.dtype)


class GatesInFloat32(ReleasedLayer):
    """MaxText's layer with fix 1: gate scales and biases used in float32."""

    def mapping(self, h, alpha_scale, beta, scale, eps=0.0):
        gate = ReleasedLayer.mapping(_SeenInDtype(self, jnp.float32), h, alpha_scale, beta, scale, eps)
        return gate.astype(self.dtype)

    def res_mapping(self, h_res):
        return ReleasedLayer.res_mapping(_SeenInDtype(self, jnp.float32), h_res).astype(self.dtype)

    def _get_mhc_weights(self):
        weights = ReleasedLayer._get_mhc_weights(_SeenInDtype(self, jnp.float32))
        return dataclasses.replace(weights, **{f: getattr(weights, f).astype(self.dtype) for f in MATMUL_FIELDS})


# The sums MaxText's reference leaves to the backend (a bfloat16 result, no accumulation dtype),
# which XLA:CPU accumulates in bfloat16: the reference's declared choices in every release state.
REFERENCE_PRECISION_CHOICES = (
    PrecisionChoice(
        "accumulate:projection:second_cotangent:bfloat16:1",
        'maxtext/layers/mhc.py:303, `h_concat = jnp.einsum("bsm,mn -> bsn", norm_x, alpha_concat, ...)`: '
        "a bfloat16 result, no preferred_element_type; its VJP's alpha gradients sum over the tokens "
        "as the backend accumulates a transposed bfloat16 dot",
        probe="dot_vjp_weights",
    ),
    PrecisionChoice(
        "accumulate:post_gate:first_cotangent:bfloat16:1",
        "maxtext/layers/mhc.py:365, `post_out = jnp.expand_dims(layer_out, axis=2) * "
        "jnp.expand_dims(post_mapping, axis=3)`: a bfloat16 broadcast product; its VJP reduces "
        "layer_out * d_out over the embedding as the backend accumulates that reduction",
        probe="product_vjp",
    ),
)
