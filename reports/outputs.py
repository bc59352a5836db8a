"""Output paths checked before any work: a command that cannot write its results fails at
once with one line naming the path (a usage error, exit 2), not after the work with a
traceback."""

from __future__ import annotations

import os
import pathlib
import tempfile


class OutputPathError(ValueError):
    """An output path that cannot be written."""


def _folder_problem(path: pathlib.Path) -> str:
    """Why no file can be created in folder `path` (created with its parents), or ""."""
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as exc:
        return f"{exc.filename or path}: {exc.strerror or exc}"
    return ""


def writable_folder(path: str | os.PathLike) -> pathlib.Path:
    """`path` as a folder that exists and takes new files (created with its parents)."""
    path = pathlib.Path(path)
    problem = _folder_problem(path)
    if problem:
        raise OutputPathError(f"cannot write to folder {path} ({problem})")
    return path


def writable_file(path: str | os.PathLike) -> pathlib.Path:
    """`path` as a file that can be created or replaced (its folder is created if missing)."""
    path = pathlib.Path(path)
    problem = "it is a folder" if path.is_dir() else _folder_problem(path.parent)
    if not problem and path.exists() and not os.access(path, os.W_OK):
        problem = "permission denied"
    if problem:
        raise OutputPathError(f"cannot write file {path} ({problem})")
    return path
