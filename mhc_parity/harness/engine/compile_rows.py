"""Compile rows: every kernel program (this project's four, and an implementation's own
`kernel_programs`) compiled by the real TPU compiler from any host, for each of `TARGETS`, on one
chip and on the case's mesh. `pass`: an executable, with its memory figures; `fail`: the error's first
line and a cause class (`failure_cause`). Without libtpu each (target, mesh) gets one `skip` row."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
from jax._src import config as jax_config  # the thread-local cache-write threshold; no public handle

from mhc_parity.cases.spec import mesh_label
from mhc_parity.harness.engine.compare import status_row
from mhc_parity.harness.engine.implementations import MOSAIC
from mhc_parity.harness.engine.lowering_rows import case_meshes, lowering_verdict, program_row, with_blocks
from mhc_parity.harness.engine.tpu_targets import (
    TARGETS,
    TpuTarget,
    compiler_missing,
    compiles_case,
    target_label,
    target_mesh,
)
from mhc_parity.mhc.kernels import KernelConfig
from mhc_parity.mhc.kernels.lowering import kernel_programs

COMPILE_IMPL = "compile"
COMPILE_CAUSES = ("precision", "vmem", "partitioning", "unsupported op", "other")
MEMORY_COLUMNS = ("code_bytes", "argument_bytes", "output_bytes", "temp_bytes")
# `jax.stages.Compiled.memory_analysis()` attributes behind each memory column.
_MEMORY_ATTRIBUTES = {
    "code_bytes": "generated_code_size_in_bytes",
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
}
# Cause class -> what in the compiler's message (or the lowering's) says it, first match wins.
_CAUSE_PATTERNS = (
    ("vmem", re.compile(r"CompileTimeScopedVmemOom|memory space vmem", re.IGNORECASE)),
    ("precision", re.compile(r"Bad (lhs|rhs) type|contract_precision", re.IGNORECASE)),
    ("partitioning", re.compile(r"cannot be automatically partitioned", re.IGNORECASE)),
    (
        "unsupported op",
        re.compile(r"Unimplemented|NotImplementedError|not implemented|Unsupported|failed to legalize", re.IGNORECASE),
    ),
)
# XLA's "Scoped allocation with size 33.51M and limit 32.00M" (binary units, as XLA prints them).
_VMEM_SIZES = re.compile(r"size ([\d.]+)\s*([KMGT]?)i?B? and limit ([\d.]+)\s*([KMGT]?)i?B?")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """One program compiled for one target and mesh: `ok`, else `error` (the compiler's
    message), `cause` (one of `COMPILE_CAUSES`) and for "vmem" the bytes asked and allowed;
    `seconds` to lower and compile; the compiled program's memory figures (NaN on failure)."""

    program: str
    ok: bool
    error: str = ""
    cause: str = ""
    vmem_asked_bytes: float = math.nan
    vmem_allowed_bytes: float = math.nan
    seconds: float = 0.0
    code_bytes: float = math.nan
    argument_bytes: float = math.nan
    output_bytes: float = math.nan
    temp_bytes: float = math.nan

    @classmethod
    def failed(cls, program: str, error: str, seconds: float = 0.0) -> CompileResult:
        """A failure with its cause and VMEM figures read from `error`."""
        cause = failure_cause(error)
        asked, allowed = vmem_bytes(error) if cause == "vmem" else (math.nan, math.nan)
        return cls(program, False, error, cause, asked, allowed, seconds)

    @property
    def first_line(self) -> str:
        """The error's first line, with the VMEM figures for a "vmem" failure."""
        line = self.error.strip().splitlines()[0] if self.error.strip() else ""
        if self.cause == "vmem" and math.isfinite(self.vmem_asked_bytes):
            asked, allowed = self.vmem_asked_bytes / 2**20, self.vmem_allowed_bytes / 2**20
            line += f" (asked {asked:.2f} MiB, allowed {allowed:.2f} MiB)"
        return line


def failure_cause(message: str) -> str:
    """The cause class (`COMPILE_CAUSES`) of a lowering or compile error message."""
    for cause, pattern in _CAUSE_PATTERNS:
        if pattern.search(message):
            return cause
    return "other"


def vmem_bytes(message: str) -> tuple[float, float]:
    """(bytes asked, bytes allowed) of a scoped-VMEM overflow message; NaNs if it has none."""
    found = _VMEM_SIZES.search(message)
    if found is None:
        return math.nan, math.nan
    asked, asked_unit, allowed, allowed_unit = found.groups()
    return float(asked) * _UNITS[asked_unit.upper()], float(allowed) * _UNITS[allowed_unit.upper()]


def lower_on_target(fn, structs):
    """`jax.jit(fn)` traced and lowered at `structs` (shardings on a target's mesh): a `jax.stages.Lowered`."""
    return jax.jit(fn).trace(*structs).lower()


def compile_lowered(program: str, lowered) -> CompileResult:
    """Compile `lowered` for its TPU devices; never raises. Not written to JAX's persistent
    cache (a compile-only executable is not for this host)."""
    start = time.perf_counter()
    try:
        with jax_config.persistent_cache_min_compile_time_secs(math.inf):
            compiled = lowered.compile()
    except Exception as err:  # noqa: BLE001 - every failure becomes a row
        return CompileResult.failed(program, f"{type(err).__name__}: {err}", time.perf_counter() - start)
    memory = compiled.memory_analysis()
    figures = {column: float(getattr(memory, attribute, math.nan)) for column, attribute in _MEMORY_ATTRIBUTES.items()}
    return CompileResult(program, True, seconds=time.perf_counter() - start, **figures)


def compile_program(program: str, fn, structs, store=None, target_key: dict | None = None) -> CompileResult:
    """Lower and compile one program; never raises. store: a
    `mhc_parity.harness.engine.compile_store.CompileStore` that keys the compile by the lowered
    module's text and `target_key` (None: compile)."""
    start = time.perf_counter()
    try:
        lowered = lower_on_target(fn, structs)
        text = lowered.as_text()
    except Exception as err:  # noqa: BLE001 - a program that does not lower is a failed row
        return CompileResult.failed(program, f"{type(err).__name__}: {err}", time.perf_counter() - start)
    if "tpu_custom_call" not in text:
        return CompileResult.failed(program, "no tpu_custom_call in the lowered module", time.perf_counter() - start)
    lowered_s = time.perf_counter() - start
    if store is None:
        result = compile_lowered(program, lowered)
    else:
        result = store.compiled(text, target_key or {}, lambda: compile_lowered(program, lowered))
        result = dataclasses.replace(result, program=program)
    return dataclasses.replace(result, seconds=result.seconds + lowered_s)


def compile_programs(build: Callable[[], dict], store=None, target_key: dict | None = None) -> list[CompileResult]:
    """Compile every program `build()` returns ({name: (fn, structs)}); if building raises,
    that error is every program's failure (by the names given as `build.programs` if any)."""
    try:
        programs = build()
    except Exception as err:  # noqa: BLE001 - the configuration itself is rejected: one row
        return [CompileResult.failed("*", f"{type(err).__name__}: {err}")]
    return [compile_program(name, fn, structs, store, target_key) for name, (fn, structs) in programs.items()]


def target_key(target: TpuTarget, mesh_shape) -> dict:
    """What a compile is for besides its module: the target, its topology and the mesh."""
    return {
        "target": dataclasses.asdict(target),
        "mesh_shape": list(mesh_shape or ()),
        "topology": target.chip if mesh_shape is None else target.slice,
    }


def compile_path_name(target: TpuTarget, mesh) -> str:
    """This project's kernels' compile rows' path for `target` on `mesh` (None: one chip)."""
    where = "unsharded" if mesh is None else f"sharded({mesh_label(mesh)})"
    return f"{COMPILE_IMPL}/{target.name}/{where}"


def implementation_compile_name(impl_name: str, target: TpuTarget, mesh) -> str:
    """The compile rows' path of an implementation with its own kernels (`kernel_programs`)."""
    where = "unsharded" if mesh is None else f"sharded({mesh_label(mesh)})"
    return f"{impl_name}/compile-{target.name}-{where}"


def compile_names_for(case, implementations=()) -> list[str]:
    """Every compile path name `case` can produce (none if it gets no compile rows)."""
    if not compiles_case(case):
        return []
    meshes = case_meshes(case)
    names = [compile_path_name(target, mesh) for target in TARGETS for mesh in meshes]
    for impl in implementations:
        if getattr(impl, "kernel_programs", None) is not None:
            names += [implementation_compile_name(impl.name, target, mesh) for target in TARGETS for mesh in meshes]
    return names


def _every(path_name: str) -> bool:
    return True


def _arguments(case, target: TpuTarget, mesh) -> dict:
    """What this project's kernels' programs for `case` on `target`/`mesh` are built from."""
    return {
        "config": dataclasses.asdict(case.mhc_config()),
        "batch": case.batch,
        "seq": case.sequence,
        "dtype": case.dtype,
        "kernel": case.block_sizes,
        **target_key(target, mesh),
    }


def compile_rows(case, store=None, selects: Callable[[str], bool] = _every, implementations=()) -> Iterator[dict]:
    """The compile rows of `case` (none unless `compiles_case`): this project's kernels on every
    target and mesh, then each implementation's with `kernel_programs`. store: a
    `CompileStore` (None: compile everything); selects(path name): whether a path is wanted."""
    if compiles_case(case):
        yield from case_compile_rows(case, store, selects, implementations)


def case_compile_rows(case, store=None, selects: Callable[[str], bool] = _every, implementations=()) -> Iterator[dict]:
    """`compile_rows` for any case, whether the suites give it compile rows or not (the
    compile faults' cases, `mhc_parity.harness.faults.compile_faults`)."""
    missing = compiler_missing()
    missing = missing and f"{missing}: the kernels were only lowered (lowering rows)"
    skip = MOSAIC.case_skip_reason(case)
    for target in TARGETS:
        for mesh in case_meshes(case):
            candidate = compile_path_name(target, mesh)
            if selects(candidate):
                compute = functools.partial(_project_results, case, target, mesh, store)
                rows = _rows(case, candidate, target, mesh, skip or missing, compute, lowering_verdict)
                yield from with_blocks(rows, case, mesh)
    for impl in implementations:
        if impl.kernel_programs is None:
            continue
        for target in TARGETS:
            for mesh in case_meshes(case):
                candidate = implementation_compile_name(impl.name, target, mesh)
                if selects(candidate):
                    yield from _implementation_rows(case, impl, candidate, target, mesh, store, missing)


def _project_results(case, target: TpuTarget, mesh, store) -> list[CompileResult]:
    """This project's kernels' results for `case` on `target`/`mesh`, through `store` if given."""

    def build():
        return kernel_programs(
            case.mhc_config(),
            batch=case.batch,
            seq=case.sequence,
            dtype=jnp.dtype(case.dtype),
            kernel=KernelConfig(**case.block_sizes),
            mesh=target_mesh(target, mesh),
        )

    compute = functools.partial(compile_programs, build, store, target_key(target, mesh))
    return compute() if store is None else store.results(_arguments(case, target, mesh), compute)


def _implementation_rows(case, impl, candidate: str, target: TpuTarget, mesh, store, missing: str) -> Iterator[dict]:
    """The compile rows of one implementation's own kernels on `target`/`mesh`."""
    skip, outside = impl.case_skip_reason(case), impl.envelope_reason(case, mesh)
    if skip or outside:
        verdict = "skip" if skip else "unsupported"
        reason = f"{impl.name}: {skip or outside}"
        row = status_row(case, candidate=candidate, partner="", comparison="compile", verdict=verdict, reason=reason)
        yield _with_target(row, case, target, mesh)
        return

    def build():
        return impl.kernel_programs(case, target_mesh(target, mesh))

    def results():
        key = target_key(target, mesh)
        compute = functools.partial(compile_programs, build, store, key)
        return compute() if store is None else store.implementation_results(impl, case, key, compute)

    yield from _rows(case, candidate, target, mesh, missing, results, _judged_by_the_compile)


def _judged_by_the_compile(case, ok: bool, error: str) -> tuple[str, str]:
    return ("pass", "") if ok else ("fail", error)


def _with_target(row: dict, case, target: TpuTarget, mesh) -> dict:
    row.update(target=target_label(target, mesh), dtype=case.dtype, matmul_precision=case.matmul_precision)
    return row


def _rows(case, candidate: str, target: TpuTarget, mesh, skip: str, compute, judge) -> Iterator[dict]:
    """One row per program `compute()` returns, or one `skip` row."""
    if skip:
        row = status_row(case, candidate=candidate, partner="", comparison="compile", verdict="skip", reason=skip)
        yield _with_target(row, case, target, mesh)
        return
    for result in compute():
        verdict, reason = judge(case, result.ok, result.first_line)
        row = program_row(
            case,
            candidate,
            "compile",
            result.program,
            verdict,
            reason,
            bound=f"compiles for {target.device_kind} ({'one chip' if mesh is None else mesh_label(mesh)})",
            compile_s=result.seconds,
            compile_cause=result.cause,
            vmem_asked_bytes=result.vmem_asked_bytes,
            vmem_allowed_bytes=result.vmem_allowed_bytes,
            **{column: getattr(result, column) for column in MEMORY_COLUMNS},
        )
        yield _with_target(row, case, target, mesh)
