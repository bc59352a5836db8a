"""Content digests and atomic writes: the file helpers every store shares (fixtures, the
oracle cache, the program and lowering stores)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np


def digest_arrays(arrays: dict[str, np.ndarray]) -> str:
    """sha256 (hex) over every array's role, dtype, shape and bytes, in the mapping's order."""
    h = hashlib.sha256()
    for role, array in arrays.items():
        array = np.ascontiguousarray(array)
        h.update(f"{role}|{array.dtype.name}|{array.shape}|".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def array_sha256(array: np.ndarray) -> str:
    """sha256 (hex) of one array's bytes (C order)."""
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _new_file_mode() -> int:
    """0o666 less the umask, read from /proc where possible so the umask is never changed, even for an instant."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a uniquely named temporary file renamed into place: readers see the old file or
    the whole new one. The temporary is removed whatever stops the write, the write's error is raised, and the file gets
    the mode `open()` would give it (not mkstemp's private one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):  # POSIX
            os.fchmod(handle, _new_file_mode())
        with os.fdopen(handle, "wb") as stream:
            handle = -1  # the stream closes it now
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if handle != -1:
            os.close(handle)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
