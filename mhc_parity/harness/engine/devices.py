"""Which devices a path runs on, never silently downgraded (a row's `devices` column names them): the
default backend's first device, or its first data·fsdp ones for a token-sharded path; where an
accelerator has too few, the sharded paths of implementations that run anywhere use the host CPU's
simulated devices (a *host* path, ``...@cpu``, whose `vs_unsharded` partner is ``@cpu`` too)."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import jax
import numpy as np

from mhc_parity.cases.spec import MESH_AXES
from mhc_parity.mhc.precision import effective_matmul_precision

HOST_PLATFORM = "cpu"
HOST_SUFFIX = "@cpu"


class PlacementError(RuntimeError):
    """A path cannot be placed on this machine's devices; the message is the skip reason."""


class BackendError(RuntimeError):
    """JAX cannot start the backend this process asks for (e.g. JAX_PLATFORMS names one the
    machine lacks); the message is one line."""


def default_devices() -> list:
    """`jax.devices()`: the default backend's devices; BackendError (one line) when it cannot start."""
    try:
        return jax.devices()
    except RuntimeError as exc:  # jax raises RuntimeError for a backend it cannot initialise
        shown = os.environ.get("JAX_PLATFORMS", "")
        raise BackendError(
            f"JAX cannot start its backend (JAX_PLATFORMS={shown!r}): {str(exc).splitlines()[0]}"
        ) from None


@dataclasses.dataclass(frozen=True)
class Placement:
    """The devices one path runs on (mesh order), and why they are not the default's."""

    devices: tuple
    note: str = ""

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    @property
    def label(self) -> str:
        """For the row's `devices` column, e.g. ``cpu:0-7`` or ``cpu:0-7 (host: tpu has 1 device)``."""
        text = device_label(self.devices)
        return f"{text} ({self.note})" if self.note else text


def device_label(devices: Sequence) -> str:
    """``<platform>:<ids>`` with consecutive ids as ranges, e.g. ``tpu:0``, ``cpu:0-3,6``."""
    platform = devices[0].platform
    ids = sorted(d.id for d in devices)
    spans: list[list[int]] = []
    for i in ids:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"{platform}:{text}"


def needs_host(needed: int, default_devices: Sequence) -> bool:
    """True when a mesh of `needed` devices must run on the host CPU instead of the default backend."""
    return len(default_devices) < needed and default_devices[0].platform != HOST_PLATFORM


def choose_devices(needed: int, *, host: bool, default_devices: Sequence, host_devices: Sequence) -> Placement:
    """The first `needed` devices of the default backend, or of the host CPU when `host`;
    PlacementError (the skip reason) when it has fewer."""
    pool = host_devices if host else default_devices
    if len(pool) >= needed:
        note = ""
        if host:
            count = len(default_devices)
            note = f"host: {default_devices[0].platform} has {count} device{'s' if count != 1 else ''}"
        return Placement(tuple(pool[:needed]), note)
    where = "the host cpu" if host else f"the default backend ({default_devices[0].platform})"
    raise PlacementError(f"mesh needs {needed} devices, {where} has {len(pool)}")


def host_fallback(needed: int) -> bool:
    """`needs_host` for this process's default devices."""
    return needs_host(needed, default_devices())


def mesh_size(path) -> int:
    """How many devices `path` (a `mhc_parity.harness.engine.paths.Path`) runs on."""
    return 1 if path.mesh is None else path.mesh[0] * path.mesh[1]


def path_placement(path) -> Placement:
    """Where `path` (a `mhc_parity.harness.engine.paths.Path`) runs in this process; PlacementError if nowhere."""
    return choose_devices(
        mesh_size(path), host=path.host, default_devices=default_devices(), host_devices=jax.devices(HOST_PLATFORM)
    )


def runs_on_host(path, default: Sequence | None = None) -> bool:
    """Whether `path` runs on the host CPU (the oracle's backend): a host path, or any path where
    the default backend is the CPU. default: the default backend's devices (None: this process's)."""
    default = default_devices() if default is None else default
    return path.host or default[0].platform == HOST_PLATFORM


def cpu_devices_lacking(path, *, default_devices: Sequence, host_devices: Sequence) -> int:
    """How many CPU devices `path` needs that the process lacks (0 when none): a path that runs on the
    host CPU needs its mesh's devices there, as many as XLA_FLAGS simulates (the process's setting, not
    its machine's). A Mosaic path, or one on an accelerator, lacks nothing here: it is skipped with its
    reason."""
    on_host = runs_on_host(path, default_devices)
    if path.mesh is None or not on_host or not path.impl.runs_on_host:
        return 0
    return max(0, mesh_size(path) - len(host_devices))


def host_device_shortfall(path) -> int:
    """`cpu_devices_lacking` in this process."""
    return cpu_devices_lacking(path, default_devices=default_devices(), host_devices=jax.devices(HOST_PLATFORM))


@functools.cache
def placement_mesh(devices: tuple, shape: tuple[int, int]):
    """A (data, fsdp) `jax.sharding.Mesh` over `devices` (cached: one object per placement)."""
    return jax.sharding.Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES)


def precision_label(setting: str, platform: str, compute_capability=None) -> str:
    """The row's `matmul_precision`: the effective setting, and why where it differs, e.g. ``highest
    (default requested; cpu default is full float32)``."""
    effective = effective_matmul_precision(setting, platform, compute_capability)
    if effective == setting:
        return effective
    return f"{effective} (default requested; {platform} default is full float32)"
