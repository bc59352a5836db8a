"""A folder of content-addressed, checksummed entries: bytes stored under the digest of their key.

Backs the compiled-program and TPU-lowering stores (`mhc_parity.harness.engine.program_store`). An entry is one file
``<prefix>-<key digest>.bin``:

  8 bytes   header length, little-endian
  header    JSON: the key material, the payload's sha256, a checksum of the header
  payload   the stored bytes

An entry that fails verification or holds another key's material is logged, counted in `rejected` and read as a miss.
Writes are atomic. Which keys a process reads and writes: `mhc_parity.records.foreign_code`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pathlib
import threading

from mhc_parity.records.files import atomic_write
from mhc_parity.records.foreign_code import read_keys, stores_open, write_key

log = logging.getLogger(__name__)
_LENGTH_BYTES = 8


class CorruptEntry(ValueError):
    """An entry failed verification; the message says why."""


def canonical_json(document) -> bytes:
    """`document` as JSON bytes with sorted keys: equal documents, equal bytes."""
    return json.dumps(document, sort_keys=True).encode()


def key_digest(material: dict) -> str:
    """The entry name's digest of a JSON-able key material."""
    return hashlib.sha256(canonical_json(material)).hexdigest()[:40]


def header_checksum(header: dict) -> str:
    """sha256 of a header without its own "checksum" field."""
    return hashlib.sha256(canonical_json({k: v for k, v in header.items() if k != "checksum"})).hexdigest()


def encode_entry(material: dict, payload: bytes) -> bytes:
    header = {"key": material, "payload_sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)}
    header["checksum"] = header_checksum(header)
    encoded = canonical_json(header)
    return len(encoded).to_bytes(_LENGTH_BYTES, "little") + encoded + payload


def decode_entry(data: bytes, material: dict) -> bytes:
    """The verified payload of an entry written for `material`; CorruptEntry otherwise."""
    if len(data) < _LENGTH_BYTES:
        raise CorruptEntry(f"truncated: {len(data)} bytes")
    length = int.from_bytes(data[:_LENGTH_BYTES], "little")
    try:
        header = json.loads(data[_LENGTH_BYTES : _LENGTH_BYTES + length].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptEntry(f"unreadable header ({error})") from error
    if not isinstance(header, dict) or header.get("checksum") != header_checksum(header):
        raise CorruptEntry("header checksum mismatch")
    if header["key"] != json.loads(canonical_json(material)):
        raise CorruptEntry("stale: written for another key")
    payload = data[_LENGTH_BYTES + length :]
    if len(payload) != header["size"] or hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise CorruptEntry(f"payload checksum mismatch ({len(payload)} bytes, header says {header['size']})")
    return payload


class LookupCounts:
    """A disk cache's `hits`, `misses` and `rejected` (invalid entries, also misses); thread-safe."""

    def __init__(self):
        self.hits = self.misses = self.rejected = 0
        self._count_lock = threading.Lock()

    def _count(self, hits: int = 0, misses: int = 0, rejected: int = 0) -> None:
        with self._count_lock:
            self.hits += hits
            self.misses += misses
            self.rejected += rejected


class ArtifactStore(LookupCounts):
    """Entries ``<prefix>-<digest>.bin`` in `folder`. open_while_code_patched: the entries depend on no file a run-time
    patch replaces, so `code_patched` leaves this store open."""

    def __init__(self, folder: pathlib.Path, prefix: str, open_while_code_patched: bool = False):
        super().__init__()
        self.folder, self.prefix = pathlib.Path(folder), prefix
        self.open_while_code_patched = open_while_code_patched

    def _open(self) -> bool:
        return self.open_while_code_patched or stores_open()

    def entry_path(self, material: dict) -> pathlib.Path:
        return self.folder / f"{self.prefix}-{key_digest(material)}.bin"

    def load(self, material: dict) -> bytes | None:
        """The payload stored for `material` under one of its `read_keys`, or None (missing or invalid)."""
        if not self._open():  # code is patched in this process: no entry is its code's
            return None
        for key in read_keys(material):
            path = self.entry_path(key)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            try:
                payload = decode_entry(data, key)
            except CorruptEntry as error:
                self._count(rejected=1)
                log.warning("%s entry %s is invalid (%s); recomputing", self.prefix, path, error)
                continue
            self._count(hits=1)
            return payload
        self._count(misses=1)
        return None

    def reject(self, material: dict, why: str) -> None:
        """Count a verified entry the caller could not use (e.g. it fails to deserialise) as a miss."""
        self._count(hits=-1, misses=1, rejected=1)
        paths = [self.entry_path(key) for key in read_keys(material)]
        path = next((p for p in paths if p.exists()), paths[0])
        log.warning("%s entry %s is unusable (%s); recomputing", self.prefix, path, why)

    def save(self, material: dict, payload: bytes) -> None:
        """Store `payload` under `material`'s `write_key` (None: nothing stored); an unwritable folder only warns."""
        key = write_key(material) if self._open() else None
        if key is None:
            return
        path = self.entry_path(key)
        try:
            atomic_write(path, encode_entry(key, payload))
        except OSError as error:
            log.warning("could not write %s entry %s: %s", self.prefix, path, error)
