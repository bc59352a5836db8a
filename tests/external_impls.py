"""External implementations for the CLI tests, loaded with `--impl tests.external_impls:...`."""

from __future__ import annotations

import dataclasses

from mhc_parity.harness.engine.precision_choices import PrecisionChoice
from mhc_parity.mhc import reference


@dataclasses.dataclass(frozen=True)
class WrappedReference:
    """A correct external implementation: the reference path under another name."""

    name: str = "wrapped_reference"
    variants: tuple[str, ...] = ("lite",)

    def pre(self, x, weights, *, config):
        return reference.pre(x, weights, config=config)

    def post(self, layer_output, context, *, config):
        return reference.post(layer_output, context, config=config)


@dataclasses.dataclass(frozen=True)
class LosesPostGateFactor(WrappedReference):
    """A wrong one: the post gate's factor 2 is lost (out uses h_post / 2)."""

    name: str = "loses_post_gate_factor"

    def post(self, layer_output, context, *, config):
        halved = dataclasses.replace(context, h_post=context.h_post / 2)
        return reference.post(layer_output, halved, config=config)


def good():
    return WrappedReference()


def broken():
    return LosesPostGateFactor()


def raises():
    raise RuntimeError("factory failed on purpose")


@dataclasses.dataclass(frozen=True)
class DriftedOutput(WrappedReference):
    """`wrapped_reference` after a change that moves each element of `out` by 2**-20 of its
    magnitude (about 8 float32 ulps, several times the correct path's error against the
    oracle) with a sign alternating along C, less its component along `out` itself: an error
    uncorrelated with the leaf's value, so no coherent scale for the judging's gain criterion
    but a growth past x2 for the gate (a drift only the gate catches). Forward only."""

    def post(self, layer_output, context, *, config):
        import jax
        import jax.numpy as jnp

        out = reference.post(layer_output, context, config=config)
        return (out.astype("float32") + jax.lax.stop_gradient(_orthogonal_drift(out, jnp))).astype(out.dtype)


def _orthogonal_drift(out, jnp):
    """2**-20·|o| with a sign alternating along the last axis, projected off o (gain 0)."""
    o = out.astype(jnp.float32)
    sign = jnp.where(jnp.arange(o.shape[-1]) % 2 == 0, 1.0, -1.0).astype(jnp.float32)
    d = 2.0**-20 * sign * jnp.abs(o)
    return d - jnp.sum(d * o) / jnp.maximum(jnp.sum(o * o), jnp.finfo(jnp.float32).tiny) * o


def drifted():
    return DriftedOutput()


@dataclasses.dataclass(frozen=True)
class ExhaustsMemory(WrappedReference):
    """Fails as XLA does on a case too large for the device: RESOURCE_EXHAUSTED."""

    name: str = "exhausts_memory"

    def pre(self, x, weights, *, config):
        import jax

        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8589934592 bytes.")


def exhausts_memory():
    return ExhaustsMemory()


@dataclasses.dataclass(frozen=True)
class HangsOnce(WrappedReference):
    """Stuck (as code in a native call is) the first time it sees bfloat16 input: it creates
    the file named by $HANGS_MARKER and sleeps for an hour in whatever thread called it. Once
    that file exists it is the reference, so a resumed run finishes."""

    name: str = "hangs_once"

    def pre(self, x, weights, *, config):
        import os
        import pathlib
        import time

        marker = pathlib.Path(os.environ["HANGS_MARKER"])
        if x.dtype == "bfloat16" and not marker.exists():
            marker.touch()
            time.sleep(3600)
        return super().pre(x, weights, config=config)


def hangs_once():
    return HangsOnce()


@dataclasses.dataclass(frozen=True)
class PostGateInBfloat16(WrappedReference):
    """A precision choice made on purpose: the post gate's scale and bias used in bfloat16."""

    name: str = "post_gate_in_bfloat16"

    def pre(self, x, weights, *, config):
        rounded = {f: getattr(weights, f).astype("bfloat16").astype(getattr(weights, f).dtype) for f in _POST_GATE}
        return reference.pre(x, dataclasses.replace(weights, **rounded), config=config)


_POST_GATE = ("post_scale", "post_bias")
# The post gate stored in bfloat16 rounds its parameters and, through the cast's transpose, their gradients.
POST_GATE_CHOICES = tuple(
    PrecisionChoice(f"round:gate_weight/post_gate:{direction}:bfloat16", "tests/external_impls.py: stored in bfloat16")
    for direction in ("forward", "backward")
)


@dataclasses.dataclass(frozen=True)
class DeclaresPostGateInBfloat16(PostGateInBfloat16):
    """The same, declared (`precision_choices`): it joins this implementation's rounding model."""

    name: str = "declares_post_gate_in_bfloat16"
    precision_choices: tuple = POST_GATE_CHOICES


@dataclasses.dataclass(frozen=True)
class DeclaredChoiceAndDrift(DeclaresPostGateInBfloat16):
    """The declared choice, and a bug on top of it: the branch input scaled by (1 + 2**-12)
    (a leaf the post gate does not move, whose bound the choice leaves as it is)."""

    name: str = "declared_choice_and_drift"

    def pre(self, x, weights, *, config):
        layer_input, context = super().pre(x, weights, config=config)
        return (layer_input.astype("float32") * (1 + 2.0**-12)).astype(layer_input.dtype), context


def post_gate_in_bfloat16():
    return PostGateInBfloat16()


def declares_post_gate_in_bfloat16():
    return DeclaresPostGateInBfloat16()


def declared_choice_and_drift():
    return DeclaredChoiceAndDrift()


@dataclasses.dataclass(frozen=True)
class OutOfMemoryDispatching(WrappedReference):
    """Fails as XLA:CPU does when a program's buffers do not fit in the host's memory: an
    INTERNAL error that says so (the message the cold float64 oracle of an 8x512x4x1024 case
    gave on a 23 GiB machine)."""

    name: str = "dispatch_out_of_memory"

    def pre(self, x, weights, *, config):
        import jax

        raise jax.errors.JaxRuntimeError(
            "INTERNAL: Error dispatching computation: Out of memory allocating 25378366768 bytes."
        )


def dispatch_out_of_memory():
    return OutOfMemoryDispatching()


@dataclasses.dataclass(frozen=True)
class PlacementExhaustsMemory(WrappedReference):
    """The reference under another name whose inputs do not fit on its device: placing them
    (`mhc_parity.harness.engine.paths._place`, patched by the factory for this implementation's paths
    only) raises what XLA raises then."""

    name: str = "placement_exhausts_memory"


def placement_exhausts_memory():
    import jax

    import mhc_parity.harness.engine.paths as paths

    place = paths._place

    def exhausted(fixture, path, placement):
        if path.impl.name == PlacementExhaustsMemory.name:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 536870912 bytes.")
        return place(fixture, path, placement)

    paths._place = exhausted
    return PlacementExhaustsMemory()


@dataclasses.dataclass(frozen=True)
class BlocksHoldingTheGil(WrappedReference):
    """Stuck in native code that keeps the GIL, as a C extension that does not release it is:
    each call touches the file named by $BLOCKS_MARKER, then sleeps 60 s in libc through
    `ctypes.PyDLL` (which holds the GIL through the call). Meanwhile no other thread of its
    process runs Python: not the signal handlers, not a watcher thread."""

    name: str = "blocks_holding_the_gil"

    def pre(self, x, weights, *, config):
        import ctypes
        import os
        import pathlib

        pathlib.Path(os.environ["BLOCKS_MARKER"]).touch()
        ctypes.PyDLL(None).sleep(60)
        return super().pre(x, weights, config=config)


def blocks_holding_the_gil():
    return BlocksHoldingTheGil()


@dataclasses.dataclass(frozen=True)
class ScaledKernel(WrappedReference):
    """`out` times `scale` (1.0: the reference's): one code, one program per scale."""

    name: str = "scaled_kernel"
    scale: float = 1.0

    def post(self, layer_output, context, *, config):
        out = reference.post(layer_output, context, config=config)
        return (out.astype("float32") * self.scale).astype(out.dtype)


# The environment variable `scaled_by_environment` reads its scale from (a tuning knob).
SCALE_VARIABLE = "PARITY_TEST_SCALE"


def scaled_by_environment():
    """`ScaledKernel` with its scale read from $PARITY_TEST_SCALE (default 1.0)."""
    import os

    return ScaledKernel(scale=float(os.environ.get(SCALE_VARIABLE, "1.0")))


@dataclasses.dataclass(frozen=True)
class NeverRuns(WrappedReference):
    """A wrong kernel (`out` x1.5) whose envelope fits no smoke case (C a multiple of 256):
    every row of it is `unsupported`, so nothing of it is ever compared."""

    name: str = "never_runs"

    @property
    def envelope(self):
        from mhc_parity.harness.engine.envelope import Envelope

        return Envelope(embedding_multiple=256)

    def post(self, layer_output, context, *, config):
        out = reference.post(layer_output, context, config=config)
        return (out.astype("float32") * 1.5).astype(out.dtype)


def never_runs():
    return NeverRuns()


@dataclasses.dataclass(frozen=True)
class BFloat16Only(WrappedReference):
    """A correct implementation serving bfloat16 activations only (as MaxText's kernels): a
    float32 case's rows of it are `unsupported`."""

    name: str = "bfloat16_only"

    @property
    def envelope(self):
        from mhc_parity.harness.engine.envelope import Envelope

        return Envelope(act_dtypes=("bfloat16",))


def bfloat16_only():
    return BFloat16Only()


def serves_no_variant():
    """The same wrong kernel serving no variant (`variants = ()`): none of its paths runs."""
    return dataclasses.replace(NeverRuns(name="serves_no_variant"), variants=())


@dataclasses.dataclass(frozen=True)
class DropoutAtRateZero(WrappedReference):
    """`out` through a dropout at rate 0 (the reference's values) drawn from a closed-over typed
    key (`jax.random.key`, JAX's recommended form; issue 66, 5)."""

    name: str = "dropout_at_rate_zero"
    key: object = None

    def post(self, layer_output, context, *, config):
        import jax
        import jax.numpy as jnp

        out = reference.post(layer_output, context, config=config)
        keep = jax.random.bernoulli(self.key, 1.0, out.shape)
        return jnp.where(keep, out, jnp.zeros_like(out))


def dropout_with_typed_key():
    import jax

    return DropoutAtRateZero(key=jax.random.key(0))
