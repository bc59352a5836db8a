"""Room kept on the run folder's disk for a run's final manifest, so that a run stopped by a full disk can still mark it
"failed". `run` claims `RESERVE_FILE` (random bytes: no compressing filesystem stores it smaller) before it changes the
folder and releases it just before writing its final manifest (`manifest.record_stop`). A kill -9 can leave it behind;
the next run claims it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib

RESERVE_FILE = ".space-reserve"
# At least this much room, and whole 4 KiB blocks.
MIN_RESERVE_BYTES = 16 * 1024
BLOCK_BYTES = 4096
# What a finished case's record adds to the manifest, with margin.
CASE_RECORD_BYTES = 256


def reserve_path(folder: str | os.PathLike) -> pathlib.Path:
    return pathlib.Path(folder) / RESERVE_FILE


def reserve_bytes(manifest_json: dict, cases: int) -> int:
    """Room for twice the final manifest (the new file is written before the old one goes) of a run starting with
    `manifest_json` and finishing `cases` cases."""
    final = len(json.dumps(manifest_json, indent=1)) + CASE_RECORD_BYTES * cases
    size = max(MIN_RESERVE_BYTES, 2 * final)
    return -(-size // BLOCK_BYTES) * BLOCK_BYTES


class SpaceReserve:
    """`RESERVE_FILE` of `size` bytes in `folder`, claimed at once (OSError, no file left, if the disk cannot take it);
    `with` gives the room back however it ends."""

    def __init__(self, folder: str | os.PathLike, size: int):
        self.path = reserve_path(folder)
        try:
            with open(self.path, "wb") as stream:
                stream.write(os.urandom(size))
                stream.flush()
                os.fsync(stream.fileno())
        except BaseException:
            release_reserve(folder)
            raise

    def __enter__(self) -> SpaceReserve:
        return self

    def __exit__(self, *exc_info) -> None:
        release_reserve(self.path.parent)


def release_reserve(folder: str | os.PathLike) -> None:
    with contextlib.suppress(OSError):
        reserve_path(folder).unlink()
