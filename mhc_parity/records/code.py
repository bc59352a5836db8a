"""The project's code as cache-key material: `import_closure` finds every project module an entry module imports at
import time, transitively, so a module added, split or moved is covered without a list to keep.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import pathlib
import threading
from collections.abc import Iterable, Mapping

from mhc_parity.records.distributions import distribution_key, distribution_sha256, distributions_of
from mhc_parity.records.project_code import NAMESPACE, PROJECT_ROOT, code_key, digest_of, sha256_file

# Python 3.11's AST constructor keeps its recursion depth in state all threads share: concurrent
# parses can raise SystemError (docs/jax-notes.md). Stores key their entries from threads.
_PARSE_LOCK = threading.Lock()


def _module_file(name: str, root: pathlib.Path) -> pathlib.Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _import_time_nodes(tree: ast.AST):
    """The nodes run at import: not function bodies, not `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _import_time_nodes(node)


def _imported_names(path: pathlib.Path, *, anywhere: bool = False) -> tuple[str, ...]:
    """Absolute module names `path` imports at import time (`from a import b`: a.b and a); anywhere: inside functions
    too."""
    return _names_imported_by(path.read_text(encoding="utf-8"), anywhere)


@functools.lru_cache(maxsize=4096)
def _names_imported_by(source: str, anywhere: bool) -> tuple[str, ...]:
    """`_imported_names` of a source text, cached: a run's stores share most of their modules."""
    with _PARSE_LOCK:
        tree = ast.parse(source)
    names = []
    for node in ast.walk(tree) if anywhere else _import_time_nodes(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
    return tuple(names)


def within_packages(name: str, packages: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def import_closure(
    entries: tuple[str, ...],
    exclude: tuple[str, ...] = (),
    root: pathlib.Path = PROJECT_ROOT,
    *,
    anywhere: bool = False,
    outside: set[str] | None = None,
    libraries: frozenset[str] | set[str] = frozenset(),
) -> tuple[str, ...]:
    """Project-relative paths of the files `entries` (module names) import, transitively, with their packages' __init__
    files; `exclude` (module or package names) is neither included nor followed, non-project names are ignored.
    FileNotFoundError if an entry has no file under `root`.

    anywhere: follow imports inside functions too. outside: receives the top-level names imported that are not files
    under `root`, or are in `libraries` (names not followed though under `root`: packages installed beside an
    implementation in site-packages).
    """
    root = pathlib.Path(root)
    found: dict[str, pathlib.Path] = {}
    todo = list(entries)
    for entry in entries:
        if _module_file(entry, root) is None:
            raise FileNotFoundError(f"no source file for module {entry!r} under {root}")
    # Top-level name -> is it under `root`: library names are then never looked up file by file.
    tops: dict[str, bool] = {}
    while todo:
        name = todo.pop()
        if name in found or within_packages(name, exclude):
            continue
        top = name.split(".")[0]
        if top not in tops:
            tops[top] = top not in libraries and ((root / top).is_dir() or (root / f"{top}.py").is_file())
        path = _module_file(name, root) if tops[top] else None
        if path is None:
            if outside is not None and (top in libraries or _module_file(top, root) is None):
                outside.add(top)
            continue
        found[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a.b.c runs a and a.b
        todo += _imported_names(path, anywhere=anywhere)
    return tuple(sorted(path.relative_to(root).as_posix() for path in found.values()))


def closure_digest(entries: tuple[str, ...], exclude: tuple[str, ...] = (), root: pathlib.Path = PROJECT_ROOT) -> str:
    """`digest_of` the files of `import_closure(entries, exclude, root)`."""
    root = pathlib.Path(root)
    return digest_of({name: sha256_file(root / name) for name in import_closure(entries, exclude, root)})


def module_root(module: str, file: str | os.PathLike) -> pathlib.Path:
    """The folder `module` (dotted) was imported from, given its file: "pkg.mod" in <root>/pkg/mod.py has <root>."""
    file = pathlib.Path(file).resolve()
    base = file.parent if file.name == "__init__.py" else file.with_suffix("")
    return base.parents[len(module.split(".")) - 1]


@dataclasses.dataclass(frozen=True)
class ExternalCode:
    """An external implementation's code under test. files: code-file key -> sha256 (files under its root by content,
    installed packages by `distribution_key`); libraries: top-level names imported from outside its root, sorted."""

    files: Mapping[str, str]
    libraries: tuple[str, ...]


def external_code(module: str, file: str | os.PathLike) -> ExternalCode:
    """The code an external implementation's `module` (at `file`) can run: the files under its root it imports, inside
    functions too, keyed by `code_key`, plus distribution entries for the installed packages they import (not this
    project's own, recorded as sources)."""
    root = module_root(module, file)
    if _module_file(module, root) != pathlib.Path(file).resolve():  # a script run as __main__
        script = pathlib.Path(file)
        imported = {name.split(".")[0] for name in _imported_names(script, anywhere=True)}
        return ExternalCode({code_key(script): sha256_file(script)}, tuple(sorted(imported)))
    libraries: set[str] = set()
    closure = import_closure(
        (module,), root=root, anywhere=True, outside=libraries, libraries=_installed_beside(module, root)
    )
    files = {code_key(root / name): sha256_file(root / name) for name in closure}
    own = set(distributions_of((NAMESPACE,)))
    for name in distributions_of(libraries):
        if name not in own:
            key = distribution_key(name)
            files[key] = distribution_sha256(key)
    return ExternalCode(files, tuple(sorted(libraries)))


def external_code_files(module: str, file: str | os.PathLike) -> dict[str, str]:
    return dict(external_code(module, file).files)


def _installed_beside(module: str, root: pathlib.Path) -> frozenset[str]:
    """Top-level modules under an install folder `root` (it holds *.dist-info) provided by distributions other than
    `module`'s: recorded as distributions, not file by file."""
    if not any(root.glob("*.dist-info")):  # a checkout or a repository: nothing is installed there
        return frozenset()
    own = set(distributions_of((module.split(".")[0],)))
    tops = {path.stem if path.suffix == ".py" else path.name for path in root.iterdir()}
    return frozenset(top for top in tops if (found := set(distributions_of((top,)))) and not found & own)
