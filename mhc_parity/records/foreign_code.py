"""Whether code from outside this project was loaded into this process: who may write the stores.

A store entry (a fixture, an oracle answer, a compiled program, a TPU lowering) is vouched for
by the digest of the project code that produces it. An external implementation (an `--impl`
module, an object handed to `mhc_parity.harness.api` or the pytest plugin) runs in the process, and its
import may patch any project function, so the entries such a process would compute are not
vouched for by the project's sources. A process that loaded one therefore reads the stores
and writes none of them: `note_foreign_code` is called before the external code is imported,
and every store's write asks `stores_writable` first.

Plain Python (no JAX): `cases` writes fixtures through it.
"""

from __future__ import annotations

import pathlib

from mhc_parity.records.code import within_packages
from mhc_parity.records.manifest import CODE_DIRS, CODE_PACKAGES, PROJECT_ROOT

_LOADED: list[str] = []


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
    if not is_project_module(module, file) and what not in _LOADED:
        _LOADED.append(what)


def foreign_code() -> tuple[str, ...]:
    """What `note_foreign_code` recorded, in order."""
    return tuple(_LOADED)


def stores_writable() -> bool:
    """True while no foreign code was loaded into this process."""
    return not _LOADED
