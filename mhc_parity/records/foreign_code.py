"""Code from outside this project in this process, and the keys under which its stores are written.

A store entry (a fixture, an oracle answer, a compiled program, a TPU lowering) is vouched for
by the digest of the code that produces it. An external implementation (an `--impl` module, an
object handed to `mhc_parity.harness.api` or the pytest plugin) runs in the process, and its
import may patch any project function, so the project's sources alone do not vouch for what
such a process computes. Such a process therefore writes an entry only under a key that also
covers the foreign code (`write_key`): what was loaded, and for each module loaded
(`CodeRecord`) the files under its root that it imports, inside functions too, by content; the
installed distributions they import, by version and installed-files record; the Python sources
of every library they import that this project does not pin, by content (MaxText's: an edit in
place misses; the project's own package when imported from outside it); and the name and
version of every installed distribution (a library those libraries import, upgraded). A
process that loaded no foreign code keys entries as before, and entries of such processes are
read by every process (`read_keys`): they are the project's own. Where a loaded module's code
cannot be read (no file), nothing is written.

The one rule, for every store: `note_foreign_code` is called before the external code is
imported; every store's key goes through `write_key` / `read_keys`.

Soundness rests on the foreign code being a function of its files: what it computes from the
environment (a variable, the clock) is not covered, nor data files it reads, nor a library
under an unpinned one edited in place (only its version is).

Plain Python (no JAX): `cases` writes fixtures through it.
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
# This project's distribution: the libraries it pins exactly are keyed by version (its
# `dependencies`), as the project's own keys hold them.
PROJECT_DISTRIBUTION = "mhc-parity"

# (what, module) of each foreign implementation loaded, in order.
_LOADED: list[tuple[str, str]] = []
# Per process: (module, resolved file) -> its `CodeRecord`, and the installed distributions'
# digest. The record is of the code as this process loaded it (a module is not imported twice).
_RECORDS: dict[tuple[str, str], CodeRecord] = {}
_INSTALLED: list[str] = []


@dataclasses.dataclass(frozen=True)
class CodeRecord:
    """One external module's code as key material.

    files: code-file key -> sha256 (`mhc_parity.records.code.external_code`); libraries:
    top-level library -> sha256 of its Python sources (`library_sources_sha256`), for the
    libraries those files import that are neither the standard library nor pinned by this
    project ("" where one is not found).
    """

    module: str
    files: Mapping[str, str]
    libraries: Mapping[str, str]

    def digest(self) -> str:
        """One sha256 over the module name, its files and its libraries' sources."""
        joint = {"module": self.module, **{f"file:{k}": v for k, v in self.files.items()}}
        joint.update({f"library:{k}": v for k, v in self.libraries.items()})
        return digest_of(joint)


def is_project_module(name: str, file: str | None = None) -> bool:
    """True for a module of this project's `CODE_PACKAGES` (its code is what the stores are
    keyed by): `name` is one of them or inside one and, where `file` is known, that file is
    under `CODE_DIRS` (a module of that name loaded from anywhere else is foreign code)."""
    if not within_packages(name, CODE_PACKAGES):
        return False
    if file is None:
        return True
    resolved = pathlib.Path(file).resolve()
    return any(resolved.is_relative_to(PROJECT_ROOT / folder) for folder in CODE_DIRS)


def note_foreign_code(what: str, module: str, file: str | None = None) -> None:
    """Record that `what` (an `--impl` spec, a class name) from `module` (file `file`, where
    known) is loaded into this process, unless that module is the project's own."""
    if not is_project_module(module, file) and what not in foreign_code():
        _LOADED.append((what, module))


def foreign_code() -> tuple[str, ...]:
    """What `note_foreign_code` recorded, in order."""
    return tuple(what for what, _ in _LOADED)


def code_record(module: str, file: str | None = None) -> CodeRecord | None:
    """The `CodeRecord` of `module` (its file `file`, else the loaded module's), computed once
    per process; None if its code has no file to read (defined in an interactive session)."""
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
    """The record a store key of this process carries: {} where no foreign code was loaded;
    else {FOREIGN_KEY: what was loaded, each module's `CodeRecord` digest, the installed
    distributions' digest}; None where a loaded module's code cannot be recorded."""
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
    """The key under which this process may store an entry computed for `material` (JSON-able):
    `material` itself in a process that loaded no foreign code, `material` with the foreign
    code's record (`foreign_material`) in one that did, None where that code cannot be
    recorded (then the entry is not stored)."""
    foreign = foreign_material()
    if foreign is None:
        return None
    return {**material, **foreign}


def read_keys(material: dict) -> tuple[dict, ...]:
    """The keys under which this process looks an entry for `material` up, in order: the
    project's own (what a process without foreign code stores), then its `write_key`."""
    written = write_key(material)
    return (material,) if written is None or written == material else (material, written)


def known_records() -> tuple[dict, list[str]]:
    """This process's computed records, for a worker process to `adopt_records` (its parent
    computed them for the run's manifest: a worker need not read the code again)."""
    if _LOADED:
        _installed()
    return dict(_RECORDS), list(_INSTALLED)


def adopt_records(records: tuple[dict, list[str]]) -> None:
    """Take a parent's `known_records` (a worker loads the same modules from the same files:
    the record is keyed by module and file, so one of another file is not used)."""
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
    """Shut every store for the block (`stores_open`): code in this process is patched at run
    time (a fault injected), so a stored entry is not what the patched code would compute, and
    one it computes is not its sources'. Blocks nest; the stores open when the last one ends."""
    with _patched_lock:
        _patched[0] += 1
    try:
        yield
    finally:
        with _patched_lock:
            _patched[0] -= 1


def stores_open() -> bool:
    """False while a `code_patched` block runs in this process: then no store loads or saves
    anything (`mhc_parity.records.artifact_store.ArtifactStore` asks), whoever asks."""
    return _patched[0] == 0
