"""The one table of TPU compile targets (one chip and an 8-chip slice per generation), their
compile-only devices on any host with libtpu (`jax.experimental.topologies`, docs/jax-notes.md),
and which cases get compile rows."""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util

import numpy as np
from jax.experimental import topologies
from jax.sharding import AxisType, Mesh

from mhc_parity.cases.catalogue import COMPILED_DEFAULT_CASES, COMPILED_MAXTEXT_CASES
from mhc_parity.cases.spec import MESH_AXES, TPU_TAG
from mhc_parity.jax_support import given_libtpu_library

# The chips of each target's slice topology: the largest token mesh a case may ask for.
SLICE_CHIPS = 8


@dataclasses.dataclass(frozen=True)
class TpuTarget:
    """A TPU generation compiled for: `name` (in row names), the topology of one chip and of
    an 8-chip slice (`jax.experimental.topologies` names), and the device kind they report."""

    name: str
    chip: str
    slice: str
    device_kind: str


TARGETS: tuple[TpuTarget, ...] = (
    TpuTarget("v5e", chip="v5e=1x1", slice="v5e=2x4", device_kind="TPU v5 lite"),
    TpuTarget("v6e", chip="v6e=1x1", slice="v6e=2x4", device_kind="TPU v6 lite"),
    # v5p's chips are a 3-D torus: its 8 chips (2x2x2) are laid out as the case's 2-D mesh.
    TpuTarget("v5p", chip="v5p=1x1x1", slice="v5p=2x2x2", device_kind="TPU v5"),
)
# The chips' peak bandwidth and FLOP rate, by these device kinds: `mhc_parity.records.roofline.PEAKS`.


def compiles_case(case) -> bool:
    """Whether `case` gets compile rows: every `tpu` suite case; the default suite's cheapest cases covering
    each (dtype, mesh) and the maxtext suite's 2x4 and smallest unsharded cases (`COMPILED_*_CASES`)."""
    return TPU_TAG in case.all_tags or case.name in COMPILED_DEFAULT_CASES | COMPILED_MAXTEXT_CASES


def compiler_missing() -> str:
    """Why the TPU compiler cannot run here ("" where it can): libtpu not installed, nor given
    through TPU_LIBRARY_PATH (which JAX loads it from: `mhc_parity.jax_support.given_libtpu_library`)."""
    if importlib.util.find_spec("libtpu") is None and given_libtpu_library() is None:
        return "no TPU compiler on this host (libtpu is not installed: wheels exist for x86-64 Linux)"
    return ""


# A one-chip topology is one host of one chip, said explicitly: on a TPU VM libtpu otherwise takes
# the machine's own chips-per-host bounds and refuses the slice (docs/accelerators.md).
ONE_CHIP_HOST_BOUNDS = (1, 1, 1)


@functools.cache
def topology_devices(topology: str) -> tuple:
    """The compile-only devices of a named topology (e.g. "v5e=2x4"), in JAX's order."""
    chips = int(np.prod([int(d) for d in topology.partition("=")[2].split("x")]))
    options = {"chips_per_host_bounds": ONE_CHIP_HOST_BOUNDS} if chips == 1 else {}
    return tuple(topologies.get_topology_desc(topology, platform="tpu", **options).devices)


def target_mesh(target: TpuTarget, mesh_shape: tuple[int, int] | None) -> Mesh:
    """A mesh of `target`'s compile-only devices over ("data", "fsdp"), `Auto` axes as a
    training mesh has: 1×1 of one chip for an unsharded program, else the first
    data×fsdp chips of its slice. ValueError for a mesh larger than the slice."""
    if mesh_shape is None:
        devices, shape = topology_devices(target.chip)[:1], (1, 1)
    else:
        shape = tuple(mesh_shape)
        size = shape[0] * shape[1]
        if size > SLICE_CHIPS:
            raise ValueError(f"a {shape[0]}x{shape[1]} mesh needs {size} chips; the targets' slices have {SLICE_CHIPS}")
        devices = topology_devices(target.slice)[:size]
    return Mesh(np.array(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def target_label(target: TpuTarget, mesh_shape: tuple[int, int] | None) -> str:
    """The `target` column: the generation and the topology compiled for."""
    return f"{target.name} ({target.chip if mesh_shape is None else target.slice})"
