"""External implementations for the CLI tests, loaded with `--impl tests.external_impls:...`."""

from __future__ import annotations

import dataclasses

from mhc import reference


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
    """`wrapped_reference` after a change that scales `out` by (1 + 2**-20): about 8 float32
    ulps, several times the correct path's error against the oracle (a drift for the gate)."""

    def post(self, layer_output, context, *, config):
        out = reference.post(layer_output, context, config=config)
        return (out.astype("float32") * (1 + 2.0**-20)).astype(out.dtype)


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
