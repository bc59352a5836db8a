"""Output paths checked before any work (a usage error naming the path, not a traceback after it), the run folder's
writer lock, and the quiet end of a command whose stdout reader went away.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import select
import stat
import sys
import tempfile
from collections.abc import Callable

# The lock file of a run folder: held (flock) by the one process writing the folder.
WRITER_LOCK_FILE = ".writer.lock"
# A lock file holding anything else is not ours and is never truncated.
LOCK_RECORD_PREFIX = b"pid "
# 128 + SIGPIPE: what a shell reports for a process a closed pipe stopped.
EXIT_CLOSED_PIPE = 141


class OutputPathError(ValueError):
    """An output path that cannot be written."""


class FolderInUseError(OutputPathError):
    """Another process is writing the run folder."""


class WriterLock:
    """`folder`'s writer lock, taken in the constructor (FolderInUseError naming the holder, before any `with`). `with`
    releases it, as does the OS when the process ends. command: recorded for the next one to name."""

    def __init__(self, folder: str | os.PathLike, command: str):
        folder = pathlib.Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._fd = _open_lock_file(folder / WRITER_LOCK_FILE)
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


def _open_lock_file(path: pathlib.Path) -> int:
    """A descriptor of lock file `path` (created if missing); OutputPathError for a symbolic link (never followed), a
    hard link, a non-regular file or one holding other data: the lock never damages another file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if os.path.islink(path):
            raise OutputPathError(
                f"{path} is a symbolic link, not a writer lock (a lock is never followed); "
                "remove it if the folder is yours"
            ) from None
        raise OutputPathError(f"cannot open the writer lock {path}: {exc.strerror or exc}") from None
    problem = _lock_file_problem(fd)
    if problem:
        os.close(fd)
        raise OutputPathError(
            f"{path} is not a writer lock of this harness ({problem}); remove it if the folder is yours"
        )
    return fd


def _lock_file_problem(fd: int) -> str:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_nlink != 1:
        return f"a file with {info.st_nlink} links"
    head = os.pread(fd, len(LOCK_RECORD_PREFIX), 0)
    if head and head != LOCK_RECORD_PREFIX:
        return "it holds other data"
    return ""


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
    """One phrase for a failed write, e.g. "cannot write out/rows.jsonl: No space left on device"."""
    return f"cannot write {exc.filename or where}: {exc.strerror or exc}"


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader closed (`| head`): a BrokenPipeError that is not a failure.
    Without poll(), any piped stdout counts."""
    try:
        fd = sys.__stdout__.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def exit_code_through_closed_stdout(main: Callable[[], int]) -> int:
    """`main()`'s exit code, stdout flushed; `EXIT_CLOSED_PIPE`, quietly, if the stdout reader went away (stdout then
    points at devnull so the exit flush cannot fail). Never exit 0 on a closed pipe; a BrokenPipeError of another pipe
    is re-raised."""
    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())
        os.close(devnull)
        return EXIT_CLOSED_PIPE
