"""Paths (implementation × sharding) and the programs they run: one case's fixture through one
implementation, unsharded or token-sharded on its mesh, as one forward pass and one VJP seeded with
the case's cotangent, giving leaf name -> array. Weights, inputs and the cotangent are arguments, so
cases of one shape and dtype share a program (`program_cache`)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.spec import MESH_AXES, mesh_label
from mhc_parity.harness.engine.devices import HOST_SUFFIX, Placement, path_placement, placement_mesh
from mhc_parity.harness.engine.implementations import Implementation
from mhc_parity.harness.engine.leaves import branch_leaf, weight_leaf
from mhc_parity.mhc.precision import device_compute_capability, effective_matmul_precision

ORACLE_PATH = "oracle"


@dataclasses.dataclass(frozen=True)
class Path:
    """An implementation run unsharded (mesh None) or token-sharded on a (data, fsdp) mesh; `host`: on
    the host CPU's devices although the default backend is an accelerator (`devices`)."""

    impl: Implementation
    mesh: tuple[int, int] | None = None
    host: bool = False

    @property
    def name(self) -> str:
        """Stable name, e.g. `reference/unsharded` or `interpret/sharded(data=2,fsdp=4)` (+`@cpu`)."""
        suffix = HOST_SUFFIX if self.host else ""
        if self.mesh is None:
            return f"{self.impl.name}/unsharded{suffix}"
        return f"{self.impl.name}/sharded({mesh_label(self.mesh)}){suffix}"

    @property
    def unsharded(self) -> Path:
        """The same implementation unsharded, on the same backend."""
        return Path(self.impl, None, self.host)


@dataclasses.dataclass(frozen=True)
class PathOutputs:
    """What one path produced: leaves (name -> array), its timing in seconds and its program's bytes.

    compile_s: obtaining its program (0 where an earlier run of the signature did).
    execute_s, execute_first_s, execute_runs: `mhc_parity.harness.engine.execution_timing`'s
    time per run, first call and the runs the time is taken from (forward and VJP together).
    bytes_moved: the program's arguments and results, in bytes (`mhc_parity.records.roofline`).
    """

    leaves: Mapping[str, np.ndarray]
    compile_s: float
    execute_s: float
    execute_first_s: float
    execute_runs: int
    bytes_moved: float = float("nan")

    @property
    def timing(self) -> tuple[float, ...]:
        """The rows' `mhc_parity.records.schema.TIMING_COLUMNS` cells, in that order."""
        return (self.compile_s, self.execute_s, self.execute_first_s, float(self.execute_runs), self.bytes_moved)


def _path_mesh(path: Path, placement: Placement):
    """The `jax.sharding.Mesh` a sharded path runs on (None when unsharded)."""
    return None if path.mesh is None else placement_mesh(placement.devices, tuple(path.mesh))


def effective_precision(case, placement: Placement) -> str:
    """The matmul precision `case` runs at on `placement`'s backend (see `mhc_parity.mhc.precision`)."""
    device = placement.devices[0]
    return effective_matmul_precision(case.matmul_precision, device.platform, device_compute_capability(device))


def _trace_signature(case, precision: str) -> tuple:
    """Everything about a case that changes the compiled program (not its data): its
    `PROGRAM_FIELDS` and the effective matmul precision (the mesh is in the path's name)."""
    return (*case.program_fields(), precision)


def _build_program(path: Path, case, placement: Placement, precision: str):
    """The un-jitted `fn(x, weights, params, cotangent) -> (forward leaves, gradient leaves)` of the
    implementation's layer and the case's branch, every dot at matmul `precision`."""
    branch = get_branch(case.branch)
    forward_of = path.impl.layer_builder().build(case, matmul_precision=precision, mesh=_path_mesh(path, placement))

    def forward(x_, w_, p_):
        return forward_of(x_, dict(w_), lambda h: branch.apply(p_, h, precision))

    return _forward_and_vjp(forward)


def _forward_and_vjp(forward):
    """The program of `forward(x, weights, params) -> (out, intermediates)`: its forward
    leaves and the gradient leaves of one VJP seeded with the cotangent."""

    def program(x, weights, params, cotangent):
        out, pullback, intermediates = jax.vjp(forward, x, weights, params, has_aux=True)
        d_x, d_w, d_p = pullback(cotangent)
        grads = {"d_x": d_x}
        grads.update({weight_leaf(k): v for k, v in d_w.items()})
        grads.update({branch_leaf(k): v for k, v in d_p.items()})
        return {"out": out, **intermediates}, grads

    return program


@dataclasses.dataclass(frozen=True)
class PlacedProgram:
    """A path's program for one case as a bench times it alone: the function, its arguments on
    the path's devices, the program lowered and compiled, and the seconds that took."""

    program: object
    args: tuple
    compiled: object
    compile_s: float
    placement: Placement


def _placed_program(path: Path, case, fixture) -> tuple[object, tuple, Placement]:
    """`path`'s un-jitted program for `case` (as a run builds it), `fixture` placed on its devices, and
    the placement."""
    placement = path_placement(path)
    program = _build_program(path, case, placement, effective_precision(case, placement))
    return program, _place(fixture, path, placement), placement


def compile_placed(path: Path, case, fixture) -> PlacedProgram:
    """`path`'s forward-and-VJP program for `case` (as a run builds it), compiled for the path's
    devices with `fixture` placed there (bench/device_speed.py, bench/interpret_cost.py)."""
    program, args, placement = _placed_program(path, case, fixture)
    start = time.perf_counter()
    compiled = jax.jit(program).lower(*args).compile()
    return PlacedProgram(program, args, compiled, time.perf_counter() - start, placement)


def xla_flops(stage) -> float:
    """XLA's FLOP count of a lowered or compiled program (its `cost_analysis()`), NaN where it gives
    none. A Pallas kernel is opaque to the analysis: its FLOPs are not counted."""
    analysis = stage.cost_analysis()
    if isinstance(analysis, list):  # older jaxlibs: one dict per computation
        analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", math.nan))


def lowered_flops(path: Path, case, fixture) -> float:
    """XLA's FLOP count of `path`'s forward-and-VJP program for `case`, lowered, not compiled: the
    arithmetic as the program states it, the same on every host (docs/speed.md). Nothing is run."""
    program, args, _ = _placed_program(path, case, fixture)
    return xla_flops(jax.jit(program).lower(*args))


def _place(fixture, path: Path, placement: Placement):
    """Fixture arrays on the path's devices: activations token-sharded on its mesh, the rest replicated."""
    arrays = (fixture.x, dict(fixture.weights), dict(fixture.branch_params), fixture.cotangent)
    if path.mesh is None:
        return jax.device_put(arrays, placement.devices[0])
    mesh = _path_mesh(path, placement)
    tokens = NamedSharding(mesh, PartitionSpec(*MESH_AXES))
    replicated = NamedSharding(mesh, PartitionSpec())
    x, weights, params, cotangent = arrays
    return (
        jax.device_put(x, tokens),
        jax.device_put(weights, replicated),
        jax.device_put(params, replicated),
        jax.device_put(cotangent, tokens),
    )
