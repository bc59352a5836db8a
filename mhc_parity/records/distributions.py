"""Installed packages as code under test: a distribution's version and installed files.

An external implementation (`--impl`) runs code from installed packages too (MaxText from the
package index). The run manifest records each distribution its modules import by a digest of
its version and its installed-files record (the wheel's RECORD: every file with its sha256),
so a reinstall of another version or build is a change of the code under test. A file edited
in place after installing is not seen this way; a package worked on is installed editable,
and its files are then recorded one by one as sources (`mhc_parity.records.code.external_code_files`).

Cache keys of what an external implementation computed need more than that
(`mhc_parity.records.foreign_code`): `library_sources_sha256` reads a library's Python sources by
content (wherever its top-level module is found, so an editable install's tree too), and
`installed_sha256` covers the name and version of every installed distribution.

Plain Python (the standard library only): the manifest reads these too.
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

# The prefix of a distribution's key among a manifest's code files (a path never has a colon
# in this position: paths are project-relative or absolute).
KEY_PREFIX = "distribution:"


def distribution_key(name: str) -> str:
    """The code-file key of distribution `name`, e.g. "distribution:maxtext"."""
    return KEY_PREFIX + name


def is_distribution_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


def distribution_sha256(key: str) -> str:
    """sha256 (hex) of the distribution's name, version and installed-files record, for a key
    of `distribution_key`; "" if it is not installed (now)."""
    name = key.removeprefix(KEY_PREFIX)
    try:
        distribution = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return ""
    record = distribution.read_text("RECORD") or ""
    return hashlib.sha256(f"{name}\0{distribution.version}\0{record}".encode()).hexdigest()


@functools.cache
def _distributions_of_modules() -> dict[str, tuple[str, ...]]:
    """Top-level module name -> the distributions providing it: what
    `importlib.metadata.packages_distributions` answers (the same mapping, checked on this
    venv), read from each distribution's top_level.txt or its RECORD's paths without asking
    the file system whether every listed file exists (which cost about 0.4 s a process)."""
    found: dict[str, list[str]] = {}
    for distribution in importlib.metadata.distributions():
        tops = (distribution.read_text("top_level.txt") or "").split() or _record_tops(distribution)
        for top in tops:
            found.setdefault(top, []).append(distribution.metadata["Name"])
    return {name: tuple(names) for name, names in found.items()}


def _record_tops(distribution) -> set[str]:
    """The importable top-level names a distribution's RECORD lists (`packages_distributions`'s inference)."""
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
    """The installed distributions that provide these top-level module names (sorted; names a
    distribution does not provide, such as the standard library's, are ignored)."""
    known = _distributions_of_modules()
    return sorted({d for module in top_level_modules for d in known.get(module, ())})


def _normalized(name: str) -> str:
    """A distribution name as the package index compares names (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def pinned_by(distribution: str) -> frozenset[str]:
    """The normalised names of the distributions `distribution` requires outside its extras
    (this project pins each exactly); empty if it is not installed."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return frozenset()
    names = (re.match(r"[A-Za-z0-9._-]+", r) for r in requirements if "extra ==" not in r)
    return frozenset(_normalized(m.group(0)) for m in names if m)


def provided_by_only(top_level_module: str, distributions: frozenset[str]) -> bool:
    """Whether `top_level_module` is provided by installed distributions, all of them among
    `distributions` (normalised names)."""
    found = distributions_of((top_level_module,))
    return bool(found) and all(_normalized(name) in distributions for name in found)


def library_sources_sha256(top_level_module: str) -> str:
    """sha256 (hex) over every Python source file of a top-level module or package, by
    relative path and content, wherever it is found now (`importlib.util.find_spec`: an
    editable install's working tree too; nothing is imported); "" if it is not found."""
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
    """sha256 (hex) of the name and version of every installed distribution: a library that
    an external implementation's libraries import in turn, reinstalled at another version, changes it."""
    named = sorted({(d.metadata["Name"] or "", d.version or "") for d in importlib.metadata.distributions()})
    return hashlib.sha256("\n".join(f"{name}\0{version}" for name, version in named).encode()).hexdigest()
