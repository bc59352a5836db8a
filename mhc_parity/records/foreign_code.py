"""Code from outside this project in this process, and the keys under which its stores are written.

An external implementation's import may patch any project function, so a process that loaded one (recorded by
`note_foreign_code`, called before the import) writes store entries only under a key that also covers that code
(`write_key`); entries of processes without foreign code are the project's own and read by every process (`read_keys`).
What the key covers and what it misses: docs/speed.md, "External implementations and foreign code".
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import sys
import threading
from collections.abc import Iterator, Mapping

from mhc_parity.records.code import external_code, within_packages
from mhc_parity.records.distributions import (
    installed_sha256,
    library_sources_sha256,
    pinned_by,
    provided_by_only,
)
from mhc_parity.records.project_code import CODE_DIRS, CODE_PACKAGES, PROJECT_ROOT, digest_of

# The key a foreign process's record takes in a store's key material.
FOREIGN_KEY = "foreign_code"
# The libraries this distribution pins exactly are keyed by version, not by source.
PROJECT_DISTRIBUTION = "mhc-parity"

# (what, module) of each foreign implementation loaded, in order.
_LOADED: list[tuple[str, str]] = []
# Per process: (module, resolved file) -> `CodeRecord`, and the installed distributions' digest.
_RECORDS: dict[tuple[str, str], CodeRecord] = {}
_INSTALLED: list[str] = []


@dataclasses.dataclass(frozen=True)
class CodeRecord:
    """One external module's code as key material. files: code-file key -> sha256 (`external_code`); libraries:
    top-level library -> `library_sources_sha256` ("" if not found) for each imported library that is neither standard
    nor pinned by this project."""

    module: str
    files: Mapping[str, str]
    libraries: Mapping[str, str]

    def digest(self) -> str:
        joint = {"module": self.module, **{f"file:{k}": v for k, v in self.files.items()}}
        joint.update({f"library:{k}": v for k, v in self.libraries.items()})
        return digest_of(joint)


def is_project_module(name: str, file: str | None = None) -> bool:
    """Whether `name` is in this project's `CODE_PACKAGES` and, where `file` is known, loaded from under `CODE_DIRS`
    (else it is foreign code)."""
    if not within_packages(name, CODE_PACKAGES):
        return False
    if file is None:
        return True
    resolved = pathlib.Path(file).resolve()
    return any(resolved.is_relative_to(PROJECT_ROOT / folder) for folder in CODE_DIRS)


def note_foreign_code(what: str, module: str, file: str | None = None) -> None:
    """Record that `what` (an `--impl` spec, a class name) from `module` is loaded, unless it is the project's own."""
    if not is_project_module(module, file) and what not in foreign_code():
        _LOADED.append((what, module))


def foreign_code() -> tuple[str, ...]:
    """What `note_foreign_code` recorded, in order."""
    return tuple(what for what, _ in _LOADED)


def code_record(module: str, file: str | None = None) -> CodeRecord | None:
    """`module`'s `CodeRecord` (from `file`, else the loaded module's), once per process; None if it has no file to
    read."""
    if file is None:
        file = getattr(sys.modules.get(module), "__file__", None)
    if not file or not pathlib.Path(file).is_file():
        return None
    memo = (module, str(pathlib.Path(file).resolve()))
    if memo not in _RECORDS:
        code = external_code(module, file)
        pinned = pinned_by(PROJECT_DISTRIBUTION)
        libraries = {
            top: library_sources_sha256(top)
            for top in code.libraries
            if top not in sys.stdlib_module_names and not provided_by_only(top, pinned)
        }
        _RECORDS[memo] = CodeRecord(module, dict(code.files), libraries)
    return _RECORDS[memo]


def _installed() -> str:
    if not _INSTALLED:
        _INSTALLED.append(installed_sha256())
    return _INSTALLED[0]


def foreign_material() -> dict | None:
    """What this process's store keys add: {} if no foreign code was loaded; None if a loaded module's code cannot be
    recorded."""
    if not _LOADED:
        return {}
    modules = {}
    for _, module in _LOADED:
        record = code_record(module)
        if record is None:
            return None
        modules[module] = record.digest()
    return {FOREIGN_KEY: {"loaded": list(foreign_code()), "modules": modules, "installed": _installed()}}


def write_key(material: dict) -> dict | None:
    """The key for storing an entry computed for `material` (JSON-able): `material` itself, or with `foreign_material`
    added; None where that code cannot be recorded (nothing is stored)."""
    foreign = foreign_material()
    if foreign is None:
        return None
    return {**material, **foreign}


def read_keys(material: dict) -> tuple[dict, ...]:
    """Keys to look `material` up under, in order: the project's own, then this process's `write_key`."""
    written = write_key(material)
    return (material,) if written is None or written == material else (material, written)


def known_records() -> tuple[dict, list[str]]:
    """This process's computed records, for a worker process to `adopt_records` rather than recompute."""
    if _LOADED:
        _installed()
    return dict(_RECORDS), list(_INSTALLED)


def adopt_records(records: tuple[dict, list[str]]) -> None:
    """Take a parent's `known_records` (keyed by module and resolved file, so one of another file is unused)."""
    computed, installed = records
    for memo, record in computed.items():
        _RECORDS.setdefault(memo, record)
    if installed and not _INSTALLED:
        _INSTALLED.extend(installed)


# Blocks of `code_patched` open in this process (any thread): while one is, the stores are shut.
_patched = [0]
_patched_lock = threading.Lock()


@contextlib.contextmanager
def code_patched() -> Iterator[None]:
    """Shut every store for the block: code is patched at run time (a fault injected), so stored entries are not what it
    computes, nor its entries its sources'. Blocks nest."""
    with _patched_lock:
        _patched[0] += 1
    try:
        yield
    finally:
        with _patched_lock:
            _patched[0] -= 1


def stores_open() -> bool:
    """False while a `code_patched` block runs in this process (any thread)."""
    return _patched[0] == 0
