"""Perturbations: small, reversible patches of one path's seams — faults (the kill matrix must see a row
fail) and legitimate variants (every row must still pass).

A seam is a module attribute a path looks up at trace time; consumers bind `mhc_parity.mhc.common`'s helpers
by name, so `mhc_parity.mhc.reference.compute_sigmoid_gate` and
`mhc_parity.mhc.kernels.forward.compute_sigmoid_gate` are different seams (one path each, the oracle
untouched). Use one as a context manager, restored on exit:

    with FAULTS["kernel.gate_params_bf16"].injected():
        ...  # build and compile programs here: the patch acts at trace time

`injected()` clears JAX's tracing caches on entry and exit and shuts the disk stores meanwhile; compiled
programs held elsewhere (a `ProgramCache`) are not affected: use a fresh cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import importlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import jax

from mhc_parity.harness.judging.attribution import UNEXPLAINED_ID
from mhc_parity.records.cause_consistency import hypothesis_names
from mhc_parity.records.foreign_code import code_patched
from mhc_parity.records.kill_records import BELOW_BACKEND_SHIFT, BELOW_ROUNDING, DTYPE_SLICES, cell_float


class SeamError(LookupError):
    """A seam does not exist (renamed or moved): the perturbation cannot be injected."""


class UnknownPerturbationError(KeyError):
    """A name glob matched nothing; str() is the full message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclasses.dataclass(frozen=True)
class Seam:
    """One patchable attribute: `module` and a dotted `attribute` path inside it, e.g.
    Seam("mhc_parity.mhc.kernels.api", "_pre_core.bwd") (a custom VJP's backward rule)."""

    module: str
    attribute: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}"

    def resolve(self) -> tuple[Any, str]:
        """(object owning the final attribute, its name); SeamError if any part is missing."""
        try:
            owner: Any = importlib.import_module(self.module)
        except ImportError as exc:
            raise SeamError(f"seam {self.name}: cannot import {self.module}: {exc}") from exc
        *parents, leaf = self.attribute.split(".")
        for part in parents:
            if not hasattr(owner, part):
                raise SeamError(f"seam {self.name}: {part!r} not found")
            owner = getattr(owner, part)
        if not hasattr(owner, leaf):
            raise SeamError(f"seam {self.name}: attribute {leaf!r} not found")
        return owner, leaf


@dataclasses.dataclass(frozen=True)
class Patch:
    """One seam and how to replace it: original value -> the value to install."""

    seam: Seam
    make_replacement: Callable[[Any], Any] = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class BelowBackendShift:
    """A fault moving `leaf` by `absolute_effect` on every token, unkillable in `dtype_slice` on a backend
    whose own primitives may shift that leaf alike by more (the clean vs_oracle rows'
    `oracle_backend_shift`); where the backend has no such term (a CPU: NaN) it must be caught."""

    dtype_slice: str
    leaf: str
    absolute_effect: float
    why: str

    def reason(self, clean_rows: Sequence[dict]) -> str:
        """The listing's reason with the figures, or "" unless every clean vs_oracle row of the leaf (at
        least one) has a backend shift larger than the effect."""
        pairs = []
        for row in clean_rows:
            if row.get("leaf") != self.leaf or row.get("comparison") != "vs_oracle":
                continue
            shift, absolute, relative = (
                cell_float(row, k) for k in ("oracle_backend_shift", "max_abs_err", "max_rel_err")
            )
            largest = absolute / relative if relative > 0.0 else math.nan  # the oracle's max|leaf|
            pairs.append((shift, self.absolute_effect / largest))
        if not pairs or not all(shift > effect for shift, effect in pairs):  # NaN compares False
            return ""
        return (
            f"{self.why} (on this backend: {self.leaf} shifted by at least {min(s for s, _ in pairs):.3g} "
            f"of its largest value by correct code, the fault by at most {max(e for _, e in pairs):.3g})"
        )


@dataclasses.dataclass(frozen=True)
class Perturbation:
    """A fault (must be caught) or a legitimate variant (must pass).

    name: ``<path>.<what>``. implementations: those whose results it can change (others need not re-run).
    sharded_only: it acts on token-sharded paths only. variants: the mHC variants going through its seams.
    unkillable_in: ((dtype slice, why), ...) where its effect is below what the arithmetic explains;
    below_backend_shift: the same, measured on the backend. causes: for a precision fault, globs of the
    hypothesis names that are its own cause; () for a logic fault (no rounding may explain it).
    """

    name: str
    description: str
    patches: tuple[Patch, ...]
    implementations: tuple[str, ...]
    sharded_only: bool = False
    variants: tuple[str, ...] = ("lite", "sinkhorn")
    legitimate: bool = False
    unkillable_in: tuple[tuple[str, str], ...] = ()
    below_backend_shift: tuple[BelowBackendShift, ...] = ()
    causes: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.patches:
            raise ValueError(f"{self.name}: a perturbation patches at least one seam")
        listed = {s for s, _ in self.unkillable_in} | {b.dtype_slice for b in self.below_backend_shift}
        if listed - set(DTYPE_SLICES) or (self.legitimate and listed):
            raise ValueError(f"{self.name}: unkillable_in names slices of {DTYPE_SLICES}, faults only")

    @property
    def seams(self) -> tuple[Seam, ...]:
        return tuple(p.seam for p in self.patches)

    @property
    def seam_names(self) -> str:
        return ", ".join(s.name for s in self.seams)

    def names_its_cause(self, cause_id: str) -> bool:
        """Whether `cause_id` is this fault's own: every hypothesis one of its `causes`, or for a logic
        fault, no rounding."""
        if not self.causes:
            return cause_id == UNEXPLAINED_ID
        names = hypothesis_names(cause_id)  # a backend hypothesis' own name joins primitives by "+"
        return bool(names) and all(any(fnmatch.fnmatchcase(name, p) for p in self.causes) for name in names)

    def listing(self, dtype_slice: str, clean_rows: Sequence[dict] = ()) -> tuple[str, str]:
        """(kind, reason) why the fault cannot be caught in `dtype_slice`, ("", "") if it must be:
        `BELOW_ROUNDING` (static) or `BELOW_BACKEND_SHIFT` (shown by that slice's `clean_rows`)."""
        static = dict(self.unkillable_in).get(dtype_slice, "")
        if static:
            return BELOW_ROUNDING, static
        measured = (b.reason(clean_rows) for b in self.below_backend_shift if b.dtype_slice == dtype_slice)
        why = next((why for why in measured if why), "")
        return (BELOW_BACKEND_SHIFT, why) if why else ("", "")

    def resolve(self) -> None:
        """Raise SeamError if any seam is missing."""
        for seam in self.seams:
            seam.resolve()

    @contextlib.contextmanager
    def injected(self) -> Iterator[Perturbation]:
        resolved = [(p, *p.seam.resolve()) for p in self.patches]
        originals = [(owner, attribute, getattr(owner, attribute)) for _, owner, attribute in resolved]
        jax.clear_caches()
        try:
            with code_patched():  # no stored program for patched code, none stored from it
                try:
                    for (patch, owner, attribute), (_, _, original) in zip(resolved, originals):
                        setattr(owner, attribute, patch.make_replacement(original))
                    yield self
                finally:
                    for owner, attribute, original in reversed(originals):
                        setattr(owner, attribute, original)
        finally:
            jax.clear_caches()

    def affects_path(self, path) -> bool:
        if path.impl.name not in self.implementations:
            return False
        return path.mesh is not None or not self.sharded_only

    def affects_case(self, case, implementations: Sequence) -> bool:
        """True if some implementation it patches runs `case` (not skipped, not expected to reject it; a
        sharded-only perturbation needs a mesh)."""
        if case.variant not in self.variants:
            return False
        if self.sharded_only and case.mesh is None:
            return False
        return any(
            impl.name in self.implementations
            and not impl.case_skip_reason(case)
            and not (impl.case_limits and case.expects_unsupported)
            for impl in implementations
        )


def select(globs: Iterable[str] | None, catalogue: Sequence[Perturbation], what: str) -> list[Perturbation]:
    """Members of `catalogue` matching any glob (all when none), in order; UnknownPerturbationError naming a
    glob that matches nothing."""
    patterns = list(globs or [])
    if not patterns:
        return list(catalogue)
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(p.name, pattern) for p in catalogue):
            known = ", ".join(p.name for p in catalogue)
            raise UnknownPerturbationError(f"no {what} matches {pattern!r} (known: {known})")
    return [p for p in catalogue if any(fnmatch.fnmatchcase(p.name, g) for g in patterns)]
