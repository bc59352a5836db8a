"""What a stored verdict rests on (code, policy, selection, environment) as one record, and the one comparison of two
records, read by `--resume`, `merge`, `baseline` and the gate alike.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mhc_parity.records.environment import BACKEND_DIGEST_KEY, BACKEND_TERMS_KEY, ISA_KEYS, LIBTPU_KEY
from mhc_parity.records.path_names import implementation_of

# The settings a compiler reads from the process environment: XLA's flags (the ISA cap among
# them) and libtpu's. In the environment record and in every store's key (`settings_record`).
SETTINGS = {"xla_flags": "XLA_FLAGS", "libtpu_init_args": "LIBTPU_INIT_ARGS"}
# Records differing in one of these are two environments (no resume or merge across them).
# The backend terms come before their digest: a readable difference first.
ENVIRONMENT_KEYS = (
    "backend",
    "device_kind",
    "device_count",
    "host_cpu_devices",
    *ISA_KEYS,
    *SETTINGS,
    "jax_version",
    "jaxlib_version",
    "flax_version",
    "numpy_version",
    LIBTPU_KEY,
    BACKEND_TERMS_KEY,
    BACKEND_DIGEST_KEY,
)
# The `ENVIRONMENT_KEYS` of the accelerator a process runs on; the others are its host's (libraries,
# flags, CPU), all that a result computed on the host CPU rests on (the oracle's answers: its own
# process runs with the CPU alone; `mhc_parity.harness.engine.store_keys.environment_material`).
DEVICE_ENVIRONMENT_KEYS = ("backend", "device_kind", "device_count", BACKEND_TERMS_KEY, BACKEND_DIGEST_KEY)
HOST_ENVIRONMENT_KEYS = tuple(key for key in ENVIRONMENT_KEYS if key not in DEVICE_ENVIRONMENT_KEYS)
# What the gate requires a baseline to share with the run it judges (another device kind is a
# note: `device_note`).
GATE_ENVIRONMENT_KEYS = ("backend",)
# Built-in path prefixes (tests/test_identity.py holds them to `implementations.BUILTIN` and
# the plan's rows); any other is an external implementation's.
BUILTIN_IMPLEMENTATIONS = ("reference", "interpret", "mosaic", "lowering", "compile")
SHOWN = 4


def settings_record(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The compiler settings of `environ` (`SETTINGS`), for the environment record and store keys."""
    return {key: environ.get(name, "") for key, name in SETTINGS.items()}


def environment_record(fields: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The `ENVIRONMENT_KEYS` of a run's metadata (or a manifest's record), as strings ("" where unrecorded)."""
    return tuple((key, "" if fields.get(key) is None else str(fields[key])) for key in ENVIRONMENT_KEYS)


def external_implementations(candidates: Iterable[str]) -> tuple[str, ...]:
    """The external implementations among row candidates (path names), sorted."""
    return tuple(sorted({implementation_of(str(c)) for c in candidates} - set(BUILTIN_IMPLEMENTATIONS)))


@dataclasses.dataclass(frozen=True)
class Selection:
    """What a verdict covers. cases, paths: case and path names (row candidates, the lowering's among them);
    implementations: the external ones; lowering, inside_envelope: as requested (None: a baseline of format 4 or older).
    """

    cases: tuple[str, ...]
    paths: tuple[str, ...]
    implementations: tuple[str, ...]
    lowering: bool | None = None
    inside_envelope: bool | None = None

    @classmethod
    def of_rows(cls, frame, **recorded) -> Selection:
        cases = tuple(dict.fromkeys(str(c) for c in frame["case"]))
        paths = tuple(sorted({str(c) for c in frame["candidate"]}))
        recorded.setdefault("implementations", external_implementations(paths))
        return cls(cases=cases, paths=paths, **recorded)

    @classmethod
    def of_manifest(cls, manifest) -> Selection:
        request = manifest.request
        return cls(
            cases=tuple(manifest.cases),
            paths=tuple(manifest.path_names),
            implementations=tuple(sorted(name for name, _ in request.implementations)),
            lowering=request.lowering,
            inside_envelope=request.inside_envelope,
        )

    def uncovered(self, run: Selection, *, rows_paths: Sequence[str] | None = None) -> list[str]:
        """The cases and paths of `run` this (baseline's) selection does not cover, one phrase each; rows_paths: the
        run's row candidates, where its path names are planned rather than rows."""
        found = []
        cases = [c for c in run.cases if c not in set(self.cases)]
        if cases:
            found.append(f"{len(cases)} of its {len(run.cases)} cases ({few_names(cases)})")
        known = set(self.paths)
        paths = sorted({p for p in (rows_paths if rows_paths is not None else run.paths) if p not in known})
        if paths:
            found.append(f"paths {few_names(paths)}")
        return found

    def describe(self) -> str:
        """e.g. "12 cases, 40 paths, implementations none, lowering yes"."""
        parts = [f"{len(self.cases)} cases", f"{len(self.paths)} paths"]
        parts.append(f"implementations {', '.join(self.implementations) or 'none'}")
        for name, value in (("lowering", self.lowering), ("inside envelope", self.inside_envelope)):
            if value is not None:
                parts.append(f"{name} {'yes' if value else 'no'}")
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Identity:
    """code, policy: digests; selection_digest: over the selected cases' full specs (catches an edited case file);
    environment: `environment_record` (empty where not recorded)."""

    code: str
    policy: str
    selection: Selection
    selection_digest: str = ""
    environment: tuple[tuple[str, str], ...] = ()
    code_files: tuple[tuple[str, str], ...] = ()  # (path, sha256), to name what changed

    def differences(self, other: Identity) -> list[str]:
        """Why `other` is not the same verdict's identity: one phrase per difference, [] if none."""
        found = []
        mine, theirs = self.selection, other.selection
        if mine.cases != theirs.cases:
            removed = [c for c in mine.cases if c not in theirs.cases]
            added = [c for c in theirs.cases if c not in mine.cases]
            parts = [f"{len(mine.cases)} -> {len(theirs.cases)} cases"]
            changes = (("dropped", removed), ("added", added))
            parts += [f"{label} {few_names(names)}" for label, names in changes if names]
            if not removed and not added:
                parts.append("same cases in another order")
            found.append("cases: " + ", ".join(parts))
        elif self.selection_digest != other.selection_digest:
            found.append("case specs differ under the same names (an edited case file?)")
        for name in ("paths", "implementations", "lowering", "inside_envelope"):
            before, after = getattr(mine, name), getattr(theirs, name)
            if before != after:
                label = "path names" if name == "paths" else name
                found.append(f"{label}: {shown_value(before)} -> {shown_value(after)}")
        if self.policy != other.policy:
            found.append(f"policy: {self.policy[:12]} -> {other.policy[:12]}")
        if self.code != other.code:
            before, after = dict(self.code_files), dict(other.code_files)
            changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
            found.append(f"code under test: {few_names(changed) or 'its digest'} changed")
        found += environment_differences(self.environment, other.environment)
        return found


def environment_differences(before: Iterable[tuple[str, str]], after: Iterable[tuple[str, str]]) -> list[str]:
    """One phrase per environment key that differs; a side recording no environment at all is one difference."""
    before, after = dict(before), dict(after)
    if bool(before) != bool(after):
        which = "the earlier" if not before else "the later"
        return [f"environment: {which} records none (made before environments were recorded)"]
    return [
        f"environment {key}: {before.get(key) or '(none)'!s} -> {after.get(key) or '(none)'!s}"
        for key in ENVIRONMENT_KEYS
        if (before.get(key) or "") != (after.get(key) or "")
    ]


def few_names(names: Sequence[str], limit: int = SHOWN) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def shown_value(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(shown_value(v) for v in value) + "]"
    return repr(value)
