"""The case registry: cases by stable name, grouped into suites, selectable. The module-level
functions use `default_registry()` (the built-in catalogue); `fresh_registry()` is a private
copy to add user cases to.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Iterable, Iterator

from mhc_parity.cases.catalogue import build_catalogue
from mhc_parity.cases.names import did_you_mean
from mhc_parity.cases.spec import Case, normalize_dtype


class UnknownCaseError(KeyError):
    """An unknown case name, suite or pattern; str() is the full message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DuplicateCaseError(ValueError):
    """A case name is registered twice."""


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    """None -> []; "a,b" -> ["a", "b"]; an iterable -> its items (each may hold commas)."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


class Registry:
    """Cases by name (registration order kept) and suites of case names."""

    def __init__(self):
        self._cases: dict[str, Case] = {}
        self._suites: dict[str, dict[str, None]] = {}
        self._descriptions: dict[str, str] = {}
        self._origins: dict[str, str] = {}

    # -- building ------------------------------------------------------------------

    def define_suite(self, name: str, description: str = "") -> None:
        """Declare a suite (idempotent; a later non-empty description wins)."""
        self._suites.setdefault(name, {})
        if description or name not in self._descriptions:
            self._descriptions[name] = description

    def register(self, case: Case, suites: Iterable[str] = (), *, origin: str = "") -> Case:
        """Add `case` to `suites` (declared if new). origin (e.g. a TOML path) is quoted in the
        DuplicateCaseError raised for a name already registered."""
        if not isinstance(case, Case):
            raise TypeError(f"register() takes a Case, got {type(case).__name__}")
        if case.name in self._cases:
            where = f" (first from {self._origins[case.name]})" if self._origins.get(case.name) else ""
            new = f" (again from {origin})" if origin else ""
            raise DuplicateCaseError(f"case name {case.name!r} is already registered{where}{new}")
        self._cases[case.name] = case
        self._origins[case.name] = origin
        for suite in suites:
            self.add_to_suite(suite, [case.name])
        return case

    def add_to_suite(self, suite: str, names: Iterable[str]) -> None:
        """Put registered cases into `suite` (declared if new)."""
        self.define_suite(suite)
        for name in names:
            self.get(name)  # validates
            self._suites[suite][name] = None

    def copy(self) -> Registry:
        clone = Registry()
        clone._cases = dict(self._cases)
        clone._suites = {k: dict(v) for k, v in self._suites.items()}
        clone._descriptions = dict(self._descriptions)
        clone._origins = dict(self._origins)
        return clone

    # -- lookup --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._cases)

    def __iter__(self) -> Iterator[Case]:
        return iter(self._cases.values())

    def __contains__(self, name: object) -> bool:
        return name in self._cases

    def names(self) -> tuple[str, ...]:
        return tuple(self._cases)

    def get(self, name: str) -> Case:
        """The case called `name`; UnknownCaseError with close matches otherwise."""
        try:
            return self._cases[name]
        except KeyError:
            raise UnknownCaseError(
                f"unknown case {name!r}{did_you_mean(str(name), self._cases)} "
                f"(`python -m mhc_parity.cases list` shows all {len(self._cases)})"
            ) from None

    def suites(self) -> dict[str, str]:
        """Suite name -> description, in declaration order."""
        return {name: self._descriptions.get(name, "") for name in self._suites}

    def suite(self, name: str) -> tuple[Case, ...]:
        """The cases of one suite, in registration order."""
        if name not in self._suites:
            raise UnknownCaseError(
                f"unknown suite {name!r}{did_you_mean(str(name), self._suites)} (known: {', '.join(self._suites)})"
            )
        members = self._suites[name]
        return tuple(c for c in self._cases.values() if c.name in members)

    def suites_of(self, name: str) -> tuple[str, ...]:
        """The suites a case belongs to."""
        self.get(name)
        return tuple(s for s, members in self._suites.items() if name in members)

    def select(
        self,
        suite: str | None = None,
        names: str | Iterable[str] | None = None,
        tags: str | Iterable[str] | None = None,
        dtype: str | None = None,
    ) -> tuple[Case, ...]:
        """Cases matching every given criterion, in order. names: fnmatch globs (comma separated),
        any one matches; tags: all required, ``"!tag"`` excludes; dtype: an activation dtype or
        alias. An unknown suite or a pattern matching no case raises UnknownCaseError."""
        candidates = list(self.suite(suite)) if suite is not None else list(self._cases.values())
        patterns = _as_list(names)
        if patterns:
            for pattern in patterns:
                if not any(fnmatch.fnmatchcase(name, pattern) for name in self._cases):
                    if any(ch in pattern for ch in "*?["):
                        raise UnknownCaseError(f"case pattern {pattern!r} matches no registered case")
                    self.get(pattern)  # raises with a did-you-mean
            candidates = [c for c in candidates if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
        wanted = _as_list(tags)
        if wanted:
            include = [t for t in wanted if not t.startswith("!")]
            exclude = [t[1:] for t in wanted if t.startswith("!")]
            candidates = [
                c
                for c in candidates
                if all(t in c.all_tags for t in include) and not any(t in c.all_tags for t in exclude)
            ]
        if dtype is not None:
            canonical = normalize_dtype(dtype, field="dtype")
            candidates = [c for c in candidates if c.dtype == canonical]
        return tuple(candidates)


_default: Registry | None = None
_default_lock = threading.Lock()


def default_registry() -> Registry:
    """The built-in catalogue (built once, on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            registry = Registry()
            build_catalogue(registry)
            _default = registry
        return _default


def fresh_registry() -> Registry:
    """A private copy of the built-in catalogue, safe to extend."""
    return default_registry().copy()


def get(name: str) -> Case:
    return default_registry().get(name)


def select(suite=None, names=None, tags=None, dtype=None) -> tuple[Case, ...]:
    return default_registry().select(suite=suite, names=names, tags=tags, dtype=dtype)


def register(case: Case, suites: Iterable[str] = (), *, origin: str = "") -> Case:
    """Register into the shared default registry (prefer `fresh_registry()` in libraries)."""
    return default_registry().register(case, suites, origin=origin)


def suites() -> dict[str, str]:
    return default_registry().suites()
