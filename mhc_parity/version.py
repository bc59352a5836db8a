"""The project's version (pyproject.toml's [project] version): the installed distribution's
metadata, else the checkout's pyproject.toml. Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

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
