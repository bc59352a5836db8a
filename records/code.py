"""The project's code as cache-key material: the modules an entry module imports.

A stored answer (an oracle answer, a compiled program) is keyed by the code it is computed
from. `import_closure` finds that code from the imports themselves — every project module
an entry module imports at import time, transitively, with the packages each belongs to —
so a module added, split or moved is covered without a list to keep; the tests that trace
what actually runs check that the closure covers it.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterable

from records.manifest import PROJECT_ROOT, digest_of, sha256_file


def _module_file(name: str, root: pathlib.Path) -> pathlib.Path | None:
    """The file of project module `name` under `root` (a package's __init__.py), or None."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _import_time_nodes(tree: ast.AST):
    """The nodes that run when the module is imported: not function bodies, not `if
    TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _import_time_nodes(node)


def _imported_names(path: pathlib.Path) -> list[str]:
    """Every absolute module name `path` imports at import time (`from a import b`: a.b and a)."""
    names = []
    for node in _import_time_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
    return names


def _within(name: str, packages: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def import_closure(
    entries: tuple[str, ...], exclude: tuple[str, ...] = (), root: pathlib.Path = PROJECT_ROOT
) -> tuple[str, ...]:
    """Project-relative paths of the files `entries` (module names) import at import time,
    transitively, with their packages' __init__ files; modules under `exclude` (module or
    package names) are neither included nor followed. Names that are not project files
    (libraries, attributes) are ignored. FileNotFoundError if an entry is not a file under
    `root`."""
    root = pathlib.Path(root)
    found: dict[str, pathlib.Path] = {}
    todo = list(entries)
    for entry in entries:
        if _module_file(entry, root) is None:
            raise FileNotFoundError(f"no source file for module {entry!r} under {root}")
    while todo:
        name = todo.pop()
        if name in found or _within(name, exclude):
            continue
        path = _module_file(name, root)
        if path is None:
            continue
        found[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a.b.c runs a and a.b
        todo += _imported_names(path)
    return tuple(sorted(path.relative_to(root).as_posix() for path in found.values()))


def closure_digest(entries: tuple[str, ...], exclude: tuple[str, ...] = (), root: pathlib.Path = PROJECT_ROOT) -> str:
    """`records.manifest.digest_of` the files of `import_closure(entries, exclude, root)`."""
    root = pathlib.Path(root)
    return digest_of({name: sha256_file(root / name) for name in import_closure(entries, exclude, root)})
