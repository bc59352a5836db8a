"""Content digests and atomic writes: the file helpers every store shares (fixtures, the
oracle cache, the program and lowering stores)."""

from __future__ import annotations

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


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file renamed into place: readers (other
    processes included) see the old file or the whole new one, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
