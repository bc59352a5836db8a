"""Room kept on the run folder's disk for a run's last word: its final manifest.

A full disk stops a run at whatever write meets it (the row stream, a manifest update, a
report). The manifest must still end "failed" (or "interrupted", or "complete"), or the
folder would claim a run still going, and that needs room on the very disk that filled.
So `run` claims `RESERVE_FILE` before it changes the folder, a file of real bytes (random,
so that no compressing filesystem stores it in less), and gives the room back
(`release_reserve`) just before it writes its final manifest (`mhc_parity.records.manifest.record_stop`
does for every stopped run), which then fits whatever filled the disk. A kill -9 can leave
the file behind; the next run of the folder claims it again.
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
# What a finished case adds to the manifest (its record: name, row count, digest), with margin.
CASE_RECORD_BYTES = 256


def reserve_path(folder: str | os.PathLike) -> pathlib.Path:
    return pathlib.Path(folder) / RESERVE_FILE


def reserve_bytes(manifest_json: dict, cases: int) -> int:
    """Room for twice the final manifest of a run whose first manifest is `manifest_json`
    (`Manifest.to_json()`) and which finishes `cases` cases: a manifest is written to a new
    file before the old one goes."""
    final = len(json.dumps(manifest_json, indent=1)) + CASE_RECORD_BYTES * cases
    size = max(MIN_RESERVE_BYTES, 2 * final)
    return -(-size // BLOCK_BYTES) * BLOCK_BYTES


class SpaceReserve:
    """`RESERVE_FILE` of `size` bytes in `folder`, claimed at once (OSError if the disk cannot
    take it, with no file left); `with` gives the room back at the end, however it ends."""

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
    """Give back the room `folder`'s reserve holds (nothing if it has none)."""
    with contextlib.suppress(OSError):
        reserve_path(folder).unlink()
