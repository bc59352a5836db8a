"""The project's code as files: where its sources are, which can change a number in a row (`CODE_DIRS`), and their
sha256 digests, from which the manifest and every store key are made.
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from mhc_parity.records.distributions import distribution_sha256, is_distribution_key

# The folder holding the `mhc_parity` package (a checkout's root; site-packages once installed).
PROJECT_ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMESPACE = "mhc_parity"
# Packages whose sources can change a number in a row: `reports` only renders rows, and
# `maxtext_parity` is recorded as an external implementation's code.
CODE_PACKAGES = tuple(f"{NAMESPACE}.{name}" for name in ("mhc", "cases", "records", "harness"))
CODE_DIRS = tuple(package.replace(".", "/") for package in CODE_PACKAGES)


def sha256_file(path: pathlib.Path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def code_key(path: pathlib.Path) -> str:
    """A file's key in `code_files`: relative to the project when inside it, else absolute."""
    resolved = pathlib.Path(path).resolve()
    try:
        return resolved.relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        return resolved.as_posix()


def in_code_dirs(key: str) -> bool:
    """Whether a code-file key (a project-relative path) is under one of `CODE_DIRS`."""
    return any(key.startswith(folder + "/") for folder in CODE_DIRS)


def project_code_files(root: pathlib.Path = PROJECT_ROOT) -> dict[str, str]:
    """sha256 of every Python source under `CODE_DIRS`, keyed by project-relative path."""
    files = {}
    for folder in CODE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            files[path.relative_to(root).as_posix()] = sha256_file(path)
    return files


def code_files(extra: Mapping[str, str] = MappingProxyType({})) -> dict[str, str]:
    """`project_code_files()` plus `extra` (key -> sha256: external implementations' code), in key order."""
    files = project_code_files()
    files.update(extra)
    return dict(sorted(files.items()))


def current_sha256(key: str, root: pathlib.Path = PROJECT_ROOT) -> str:
    """The sha256 a code-file `key` has now (a file's or a distribution's); "" if it no longer exists."""
    if is_distribution_key(key):
        return distribution_sha256(key)
    path = pathlib.Path(key) if pathlib.Path(key).is_absolute() else root / key
    return sha256_file(path) if path.is_file() else ""


def digest_of(files: Mapping[str, str]) -> str:
    """One sha256 over (path, sha256) pairs in path order."""
    joint = hashlib.sha256()
    for key in sorted(files):
        joint.update(f"{key}\0{files[key]}\n".encode())
    return joint.hexdigest()


def source_digest(patterns: Iterable[str], root: pathlib.Path = PROJECT_ROOT, exclude: Iterable[str] = ()) -> str:
    """`digest_of` the files matching each glob pattern under `root`, less `exclude`
    (project-relative paths). FileNotFoundError if a pattern matches no file."""
    root, excluded = pathlib.Path(root), set(exclude)
    files = {}
    for pattern in patterns:
        matched = {path.relative_to(root).as_posix(): path for path in root.glob(pattern) if path.is_file()}
        if not matched:
            raise FileNotFoundError(f"no source file matches {pattern!r} under {root}")
        files.update({name: sha256_file(path) for name, path in matched.items() if name not in excluded})
    return digest_of(files)
