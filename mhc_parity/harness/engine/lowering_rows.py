"""Lowering rows: each kernel program's Mosaic (TPU) lowering checked from any machine, unsharded and,
with a mesh, token-sharded on an abstract TPU mesh, at the case's matmul precision. The leaf is the
program; `pass`: it lowered to a Mosaic custom call. Nothing runs, so `devices` stays empty."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator

import jax.numpy as jnp

from mhc_parity.cases.spec import mesh_label
from mhc_parity.harness.engine.compare import status_row
from mhc_parity.harness.engine.implementations import MOSAIC
from mhc_parity.harness.engine.kernel_blocks import blocks_label
from mhc_parity.mhc.kernels import KernelConfig
from mhc_parity.mhc.kernels.lowering import lower_kernel_programs

LOWERING_IMPL = "lowering"


def _every(path_name: str) -> bool:
    return True


def lowering_path_name(mesh: tuple[int, int] | None) -> str:
    return f"{LOWERING_IMPL}/unsharded" if mesh is None else f"{LOWERING_IMPL}/sharded({mesh_label(mesh)})"


def lowering_verdict(case, ok: bool, error: str) -> tuple[str, str]:
    if case.expects_unsupported:
        if not ok:
            if "UnsupportedInputError" in error and case.expect_reason in error:
                return "unsupported", error
            return "fail", f"rejected for another reason than {case.expect_reason!r}: {error}"
        return "fail", f"lowered input the case expects the kernels to reject ({case.expect_reason!r})"
    return ("pass", "") if ok else ("fail", error)


def lowering_rows(case, store=None, selects: Callable[[str], bool] = _every) -> Iterator[dict]:
    """Rows for every kernel program of `case`, unsharded and (with a mesh) sharded. store: a
    `LoweringStore` that reuses earlier results (None: lower every program); selects(path name):
    whether a path's rows are wanted (a path not selected is not lowered at all)."""
    for row in _rows(case, store, selects):
        row["matmul_precision"] = case.matmul_precision  # the precision the programs were lowered at
        yield row


def _lower(case, mesh, store) -> list:
    arguments = dict(
        config=case.mhc_config(),
        batch=case.batch,
        seq=case.sequence,
        dtype=jnp.dtype(case.dtype),
        kernel=KernelConfig(**case.block_sizes),
        mesh_shape=mesh or (),
    )
    if store is None:
        return lower_kernel_programs(**arguments)
    described = {
        **arguments,
        "config": dataclasses.asdict(arguments["config"]),
        "dtype": str(arguments["dtype"]),
        "kernel": dataclasses.asdict(arguments["kernel"]),
        "mesh_shape": list(arguments["mesh_shape"]),
    }
    return store.lower(described, lambda: lower_kernel_programs(**arguments))


def case_meshes(case) -> list:
    """The meshes a case's lowering rows are for: None (unsharded), then its mesh if it has one."""
    return [None] + ([tuple(case.mesh)] if case.mesh is not None else [])


def _rows(case, store, selects) -> Iterator[dict]:
    skip = MOSAIC.case_skip_reason(case)  # the lowered programs are the Mosaic kernels
    for mesh in case_meshes(case):
        if not selects(lowering_path_name(mesh)):
            continue
        rows = _program_rows(case, lowering_path_name(mesh), skip, lambda mesh=mesh: _lower(case, mesh, store))
        yield from with_blocks(rows, case, mesh)


def with_blocks(rows: Iterable[dict], case, mesh) -> Iterator[dict]:
    """`rows` of this project's Mosaic programs for `case` on `mesh` (lowered or compiled), each
    but a skip row with the blocks those programs hold (`kernel_blocks`: fitted as on the chip)."""
    blocks = blocks_label(case, interpret=False, mesh=mesh)
    for row in rows:
        if row["verdict"] != "skip":
            row["kernel_blocks"] = blocks
        yield row


def _judged_by_the_lowering(case, ok: bool, error: str) -> tuple[str, str]:
    return ("pass", "") if ok else ("fail", error)


def _program_rows(case, candidate: str, skip: str, lower, expects_case_limits: bool = True) -> Iterator[dict]:
    """One row per program `lower()` returns (`LoweringResult`s), a `skip` row if `skip`,
    one row for the path if `lower` raises. expects_case_limits: the case's expected
    rejection applies to these programs (this project's kernels)."""
    if skip:
        yield status_row(case, candidate=candidate, partner="", comparison="lowering", verdict="skip", reason=skip)
        return
    judge = lowering_verdict if expects_case_limits else _judged_by_the_lowering
    try:
        results = lower()
    except Exception as exc:  # noqa: BLE001 - the config itself is invalid (any error): one row for the path
        verdict, reason = judge(case, False, f"{type(exc).__name__}: {exc}")
        yield status_row(case, candidate=candidate, partner="", comparison="lowering", verdict=verdict, reason=reason)
        return
    for result in results:
        verdict, reason = judge(case, result.ok, result.error)
        yield program_row(
            case,
            candidate,
            "lowering",
            result.program,
            verdict,
            reason,
            bound="lowers to a Mosaic tpu_custom_call",
            compile_s=result.seconds,
        )


def program_row(case, candidate: str, comparison: str, program: str, verdict: str, reason: str, **columns) -> dict:
    """The row of one kernel program's lowering or compile check (leaf: the program; no
    partner), with the check's own `columns` (its bound in words, seconds, figures)."""
    row = status_row(
        case, candidate=candidate, partner="", comparison=comparison, verdict=verdict, reason=reason, leaf=program
    )
    row.update(leaf_kind="program", **columns)
    return row


def implementation_lowering_name(impl_name: str, mesh: tuple[int, int] | None) -> str:
    """The lowering rows' path of an implementation with its own kernels (`Implementation.lower`)."""
    return f"{impl_name}/lowering-unsharded" if mesh is None else f"{impl_name}/lowering-sharded({mesh_label(mesh)})"


def implementation_lowering_rows(case, impl, store=None, selects: Callable[[str], bool] = _every) -> Iterator[dict]:
    """Rows for the kernel programs an implementation lowers itself (`impl.lower(case, mesh_shape)`),
    unsharded and (with a mesh) token-sharded; a case outside its envelope gives `unsupported` rows.
    store, selects: as for `lowering_rows` (`LoweringStore.lower_implementation` keys the results)."""
    for mesh in case_meshes(case):
        candidate = implementation_lowering_name(impl.name, mesh)
        if not selects(candidate):
            continue
        skip, outside = impl.case_skip_reason(case), impl.envelope_reason(case, mesh)
        if skip or outside:
            yield status_row(
                case,
                candidate=candidate,
                partner="",
                comparison="lowering",
                verdict="skip" if skip else "unsupported",
                reason=f"{impl.name}: {skip or outside}",
            )
            continue
        lower = functools.partial(impl.lower, case, mesh or ())
        if store is not None:
            lower = functools.partial(store.lower_implementation, impl, case, mesh or (), lower)
        for row in _program_rows(case, candidate, "", lower, expects_case_limits=False):
            row["matmul_precision"] = case.matmul_precision
            yield row
