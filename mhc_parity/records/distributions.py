"""Installed packages as code under test: a distribution's version and installed files.

An external implementation (`--impl`) runs code from installed packages too (MaxText from the
package index). The run manifest records each distribution its modules import by a digest of
its version and its installed-files record (the wheel's RECORD: every file with its sha256),
so a reinstall of another version or build is a change of the code under test. A file edited
in place after installing is not seen this way; a package worked on is installed editable,
and its files are then recorded one by one as sources (`mhc_parity.records.code.external_code_files`).

Plain Python (the standard library only): the manifest reads these too.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
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
    return {name: tuple(found) for name, found in importlib.metadata.packages_distributions().items()}


def distributions_of(top_level_modules: Iterable[str]) -> list[str]:
    """The installed distributions that provide these top-level module names (sorted; names a
    distribution does not provide, such as the standard library's, are ignored)."""
    known = _distributions_of_modules()
    return sorted({d for module in top_level_modules for d in known.get(module, ())})
