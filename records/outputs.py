"""Output paths checked before any work: a command that cannot write its results fails at
once with one line naming the path (a usage error, exit 2), not after the work with a
traceback."""

from __future__ import annotations

import fcntl
import os
import pathlib
import tempfile

# The lock file of a run folder: held (flock) by the one process writing the folder.
WRITER_LOCK_FILE = ".writer.lock"


class OutputPathError(ValueError):
    """An output path that cannot be written."""


class FolderInUseError(OutputPathError):
    """Another process is writing the run folder."""


class WriterLock:
    """`folder`'s writer lock, taken at once: FolderInUseError naming the holder if another
    process holds it (raised here, before any `with`, so a caller tells it apart from its
    block's errors). `with` releases it; the OS does when the process ends, however it ends.

    command: what this process is (recorded in the lock file for the next one to name).
    """

    def __init__(self, folder: str | os.PathLike, command: str):
        folder = pathlib.Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(folder / WRITER_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(self._fd, 4096, 0).decode(errors="replace").strip() or "a process that did not say"
                raise FolderInUseError(
                    f"{folder} is being written by another run ({holder}); wait for it to end or choose another folder"
                ) from None
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"pid {os.getpid()}: {command}"[:4000].encode(), 0)
        except BaseException:
            os.close(self._fd)
            raise

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc_info) -> None:
        os.close(self._fd)  # releases the lock; the file stays (removing it would race the next writer)


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


def cannot_write(exc: OSError, where: str | os.PathLike) -> str:
    """One phrase for a failed write, e.g. "cannot write out/rows.jsonl: No space left on
    device"; the file the error names, else `where`."""
    return f"cannot write {exc.filename or where}: {exc.strerror or exc}"
