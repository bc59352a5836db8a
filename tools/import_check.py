"""Import modules in turn; on the first that fails, print one line naming the package at fault.

`make setup SYSTEM_JAX=1` ends with it (tools/install_on_own_jax.py): packages installed beside
the machine's kept ones may not import with them (the newest anyio imports `sentinel` from
typing_extensions, which a kept 4.15.0 lacks), and pip, told `--no-deps`, cannot see that.

    python tools/import_check.py MODULE [MODULE ...]    exit 0, or 1 with the line on stderr
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import traceback


def distribution(module: str) -> str:
    """`name version` of the installed distribution that provides top-level `module`, else `module`."""
    top = module.partition(".")[0]
    names = importlib.metadata.packages_distributions().get(top, [])
    for name in names:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return top


def at_fault(exc: BaseException) -> str:
    """The package whose code raised `exc` (its deepest frame), and the one it could not import
    from, e.g. "anyio 4.15.1 (from typing_extensions 4.15.0)"."""
    frames = traceback.extract_tb(exc.__traceback__)
    modules = [f.filename for f in frames]
    raiser = ""
    for frame in reversed(frames):
        module = _module_of(frame.filename)
        if module and not module.startswith("importlib"):
            raiser = distribution(module)
            break
    missing = getattr(exc, "name", None)
    source = f" (from {distribution(missing)})" if isinstance(exc, ImportError) and missing else ""
    return (raiser or (modules[-1] if modules else "?")) + source


def _module_of(filename: str) -> str:
    """The dotted module of a file under one of sys.path's folders ("" when none holds it)."""
    best = ""
    for folder in sys.path:
        if folder and filename.startswith(folder.rstrip("/") + "/") and len(folder) > len(best):
            best = folder
    if not best:
        return ""
    relative = filename[len(best.rstrip("/")) + 1 :].removesuffix(".py").removesuffix("/__init__")
    return relative.replace("/", ".")


def main(modules: list[str]) -> int:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure to import is what this reports
            message = " ".join(f"{type(exc).__name__}: {exc}".split())
            print(f"import {module} fails in {at_fault(exc)}: {message}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
