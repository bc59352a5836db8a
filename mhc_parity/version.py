"""The project's version: one source, pyproject.toml's [project] version.

Installed, it is the distribution's metadata (what a bug report should quote: the code pip
put in place); a checkout run without installing it (`python -m mhc_parity.harness` from its
root) reads its pyproject.toml. `mhc-parity --version` and `mhc_parity.__version__` print it.
Plain Python (the standard library only).
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

# The distribution `pip install` records (pyproject.toml's [project] name), and the file a
# checkout that was never installed reads its version from.
DISTRIBUTION = "mhc-parity"
PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def version() -> str:
    """The installed distribution's version, else that of the checkout's pyproject.toml."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return pyproject_version(PYPROJECT)


def pyproject_version(path: pathlib.Path) -> str:
    """[project] version of a pyproject.toml; "unknown" where the file or the key is missing."""
    try:
        project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return "unknown"
    return str(project.get("version", "unknown"))
