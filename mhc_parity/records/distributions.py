"""Installed packages as code under test: a distribution's key is a digest of its version and RECORD (every installed
file's sha256), so reinstalling another version or build changes it; a file edited in place is not seen (work on a
package installed editable: its files are recorded as sources). `library_sources_sha256` and `installed_sha256` are the
stricter digests for cache keys (`mhc_parity.records.foreign_code`).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import pathlib
import re
from collections.abc import Iterable

# A manifest code-file key with this prefix names a distribution (no path has a colon there).
KEY_PREFIX = "distribution:"


def distribution_key(name: str) -> str:
    return KEY_PREFIX + name


def is_distribution_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


def distribution_sha256(key: str) -> str:
    """sha256 (hex) of a `distribution_key`'s name, version and RECORD; "" if not installed."""
    name = key.removeprefix(KEY_PREFIX)
    try:
        distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return ""
    record = distribution.read_text("RECORD") or ""
    return hashlib.sha256(f"{name}\0{distribution.version}\0{record}".encode()).hexdigest()


@functools.cache
def _distributions_of_modules() -> dict[str, tuple[str, ...]]:
    """Top-level module name -> distributions providing it: what `importlib.metadata.packages_distributions` answers,
    without its file-existence checks (about 0.4 s a process)."""
    found: dict[str, list[str]] = {}
    for distribution in importlib.metadata.distributions():
        tops = (distribution.read_text("top_level.txt") or "").split() or _record_tops(distribution)
        for top in tops:
            found.setdefault(top, []).append(distribution.metadata["Name"])
    return {name: tuple(names) for name, names in found.items()}


def _record_tops(distribution) -> set[str]:
    tops = set()
    for row in csv.reader((distribution.read_text("RECORD") or "").splitlines()):
        if not row:
            continue
        parts = row[0].split("/")
        name = parts[0] if len(parts) > 1 else inspect.getmodulename(parts[0])
        if name and "." not in name:
            tops.add(name)
    return tops


def distributions_of(top_level_modules: Iterable[str]) -> list[str]:
    """Installed distributions providing these top-level modules, sorted (others, such as the standard library's,
    ignored)."""
    known = _distributions_of_modules()
    return sorted({d for module in top_level_modules for d in known.get(module, ())})


def _normalized(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def pinned_by(distribution: str) -> frozenset[str]:
    """Normalised names of what `distribution` requires outside its extras; empty if not installed."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return frozenset()
    names = (re.match(r"[A-Za-z0-9._-]+", r) for r in requirements if "extra ==" not in r)
    return frozenset(_normalized(m.group(0)) for m in names if m)


def provided_by_only(top_level_module: str, distributions: frozenset[str]) -> bool:
    """Whether `top_level_module` is installed and provided only by `distributions` (normalised)."""
    found = distributions_of((top_level_module,))
    return bool(found) and all(_normalized(name) in distributions for name in found)


def library_sources_sha256(top_level_module: str) -> str:
    """sha256 (hex) over every Python source of a top-level module or package, by relative path and content, wherever
    `find_spec` finds it (an editable install's tree too; nothing imported); "" if not found."""
    try:
        spec = importlib.util.find_spec(top_level_module)
    except (ImportError, ValueError):
        return ""
    if spec is None:
        return ""
    joint = hashlib.sha256(top_level_module.encode())
    if spec.submodule_search_locations:  # a package (a namespace package may have several folders)
        for folder in sorted(spec.submodule_search_locations):
            base = pathlib.Path(folder)
            for path in sorted(base.rglob("*.py")):
                name = path.relative_to(base).as_posix()
                joint.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    elif spec.origin and spec.origin.endswith(".py"):
        joint.update(hashlib.sha256(pathlib.Path(spec.origin).read_bytes()).digest())
    elif spec.origin:  # an extension module or a built-in: its file's bytes where it has one
        origin = pathlib.Path(spec.origin)
        joint.update(hashlib.sha256(origin.read_bytes()).digest() if origin.is_file() else spec.origin.encode())
    return joint.hexdigest()


def installed_sha256() -> str:
    """sha256 (hex) of the name and version of every installed distribution."""
    named = sorted({(d.metadata["Name"] or "", d.version or "") for d in importlib.metadata.distributions()})
    return hashlib.sha256("\n".join(f"{name}\0{version}" for name, version in named).encode()).hexdigest()
