"""The float64 oracle's answers (`OracleOutputs`) on disk, content-addressed: an answer is a function of
its inputs and the code computing it only, so `OracleCache` looks it up under `key_material` (the
fixture's digest, the oracle's sources, the host's environment, the case's branch, config and dtypes,
the draws' seeds and units, the token chunk, any foreign code's record). An entry holds the leaves'
float64 bits and a checksummed JSON header; it is verified on load, and an invalid one is logged and
recomputed, never used. Written atomically, so concurrent workers never read a partial file."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import pathlib
import time
from collections.abc import Callable

import numpy as np

from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.engine.oracle_path import (
    NOISE_SAMPLES,
    OracleOutputs,
    PairStatistics,
    kernel_pair_units,
    noise_seeds,
    noise_units,
    oracle_chunk_tokens,
    run_oracle_path,
)
from mhc_parity.harness.engine.store_keys import environment_material
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.records.artifact_store import LookupCounts, canonical_json, header_checksum, key_digest
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import closure_digest, import_closure
from mhc_parity.records.files import array_sha256, atomic_write
from mhc_parity.records.foreign_code import read_keys, write_key
from mhc_parity.records.project_code import PROJECT_ROOT

# Bump when the entry layout changes (part of the key).
ENTRY_FORMAT = 5
# The module that computes an oracle answer: its import closure, less the modules only a
# path's program runs (`mhc_parity.harness.engine.operation`), is the code an answer depends on
# (tests/test_oracle_cache.py checks that computing one runs nothing else of the project).
ORACLE_ENTRY = ("mhc_parity.harness.engine.oracle_path",)
_HEADER = "__header__"
_BITS = np.dtype("<u8")  # float64 leaves stored as their raw bits

log = logging.getLogger(__name__)


class CorruptOracleEntry(ValueError):
    """A cache entry failed verification; the message says why."""


def default_folder() -> pathlib.Path:
    return cache_root() / "oracle"


def oracle_sources(root: pathlib.Path = PROJECT_ROOT) -> tuple[str, ...]:
    """Project files an oracle answer is computed from (`mhc_parity.records.code.import_closure`)."""
    return import_closure(ORACLE_ENTRY, OPERATION.PROGRAM_MODULES, root)


def oracle_source_digest(root: pathlib.Path = PROJECT_ROOT) -> str:
    """`mhc_parity.records.code.closure_digest` of `oracle_sources`."""
    return closure_digest(ORACLE_ENTRY, OPERATION.PROGRAM_MODULES, root)


def own_material(source_digest: str | None = None) -> dict:
    """The part of `key_material` that is this process's, not the case's: the entry format, the
    oracle's sources (`oracle_source_digest` of this project unless given) and the host's
    environment (`store_keys.environment_material`: the versions that run the oracle, what XLA
    compiles its float64 program for — an FMA or not — and the host CPU); not the accelerator's,
    as the oracle computes on the host CPU (its own process has no other)."""
    return {
        "format": ENTRY_FORMAT,
        "oracle_sources": oracle_source_digest() if source_digest is None else source_digest,
        "environment": environment_material(devices=False),
    }


def key_material(case, fixture, source_digest: str) -> dict:
    """Everything the oracle's answer for `case` on `fixture` depends on (JSON-able)."""
    material = {
        **own_material(source_digest),
        "fixture": fixture.digest(),
        "branch": case.branch,
        "config": OPERATION.oracle_key(case),
        "dtype": case.dtype,
        "weight_dtype": case.weight_dtype,
        "draws": {"samples": NOISE_SAMPLES, "seeds": list(noise_seeds(case)), "units": noise_units(case)},
        # The tokens each chunk of the oracle holds (one chunk: every token): chunks reassociate
        # the sums over tokens, so an answer's last bits follow them.
        "chunk_tokens": min(oracle_chunk_tokens(case), math.prod(case.shape[:2])),
    }
    pair_units = kernel_pair_units(case)
    if pair_units is not None:  # absent where there is no pair (a CPU): those keys are as they were
        material["draws"]["kernel_pair_units"] = pair_units
    return material


def serialize(
    material: dict, outputs: OracleOutputs, peak_bytes: int | None = None, budget_bytes: int | None = None
) -> bytes:
    """One entry's bytes: the leaves' float64 bits and a checksummed JSON header (with the
    computing process's peak resident memory where it was measured, and the budget it ran under:
    `peak_bytes` and `budget_bytes`, else the outputs')."""
    leaves = {name: np.ascontiguousarray(value, dtype=np.float64) for name, value in outputs.leaves.items()}
    header = {
        "key": material,
        "leaves": {name: {"shape": list(a.shape), "sha256": array_sha256(a)} for name, a in leaves.items()},
        "sensitivity": {name: value.as_dict() for name, value in outputs.sensitivity.items()},
        "systematic": dict(outputs.systematic),
        "backend_shift": dict(outputs.backend_shift),
    }
    figures = {
        "peak_bytes": outputs.peak_bytes if peak_bytes is None else peak_bytes,
        "budget_bytes": outputs.budget_bytes if budget_bytes is None else budget_bytes,
    }
    header.update({name: int(value) for name, value in figures.items() if value is not None})
    if outputs.kernel_pair is not None:
        pair = outputs.kernel_pair
        header["kernel_pair"] = {
            "sensitivity": {name: value.as_dict() for name, value in pair.sensitivity.items()},
            "systematic": dict(pair.systematic),
            "backend_shift": dict(pair.backend_shift),
        }
    header["checksum"] = header_checksum(header)
    payload = {f"leaf.{name}": a.view(_BITS) for name, a in leaves.items()}
    payload[_HEADER] = np.frombuffer(canonical_json(header), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **payload)
    return buffer.getvalue()


def deserialize(data_path: pathlib.Path, material: dict) -> OracleOutputs:
    """A verified entry (execute_s 0); CorruptOracleEntry on any mismatch or read error."""
    try:
        with np.load(data_path, allow_pickle=False) as archive:
            header = json.loads(bytes(archive[_HEADER]).decode())
            raw = {name.removeprefix("leaf."): archive[name] for name in archive.files if name != _HEADER}
    except Exception as error:  # truncated zip, bad CRC, bad JSON, missing member, ...
        raise CorruptOracleEntry(f"unreadable ({type(error).__name__}: {error})") from error
    if not isinstance(header, dict) or header.get("checksum") != header_checksum(header):
        raise CorruptOracleEntry("header checksum mismatch")
    if header["key"] != json.loads(canonical_json(material)):
        raise CorruptOracleEntry("stale: written for other inputs, code or draws")
    if set(raw) != set(header["leaves"]) or set(raw) != set(header["sensitivity"]):
        raise CorruptOracleEntry(f"holds leaves {sorted(raw)}, header lists {sorted(header['leaves'])}")
    leaves = {}
    for name, bits in raw.items():
        meta = header["leaves"][name]
        if bits.dtype != _BITS or list(bits.shape) != meta["shape"]:
            raise CorruptOracleEntry(f"{name}: stored {bits.dtype} {bits.shape}, header says {meta['shape']}")
        value = bits.view(np.float64)
        if array_sha256(value) != meta["sha256"]:
            raise CorruptOracleEntry(f"{name}: checksum mismatch")
        value.setflags(write=False)
        leaves[name] = value
    main = _statistics(header)
    if ("kernel_pair" in header) != ("kernel_pair_units" in header["key"]["draws"]):
        raise CorruptOracleEntry("kernel_pair statistics do not match the key's draws")
    pair = _statistics(header["kernel_pair"]) if "kernel_pair" in header else None
    figures = {name: header.get(name) for name in ("peak_bytes", "budget_bytes")}
    for name, value in figures.items():
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise CorruptOracleEntry(f"{name} {value!r} is not a positive count of bytes")
    return OracleOutputs(
        leaves,
        main.sensitivity,
        0.0,
        systematic=main.systematic,
        backend_shift=main.backend_shift,
        kernel_pair=pair,
        **figures,
    )


def _statistics(record: dict) -> PairStatistics:
    """The sensitivity, systematic and backend-shift records of a header (or its kernel_pair)."""
    try:
        sensitivity = {name: Sensitivity.from_dict(raw) for name, raw in record["sensitivity"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptOracleEntry(f"sensitivity record unreadable ({error!r})") from error
    try:
        systematic = {name: float(t) for name, t in record["systematic"].items()}
        backend_shift = {name: float(shift) for name, shift in record["backend_shift"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CorruptOracleEntry(f"systematic record unreadable ({error!r})") from error
    return PairStatistics(sensitivity, systematic, backend_shift)


class OracleCache(LookupCounts):
    """`oracle(case, fixture) -> OracleOutputs`, from the disk cache when a verified entry exists.

    folder: default `<cache>/oracle`; compute(case, fixture): the oracle itself (default
    `run_oracle_path`); source_root: the project whose `oracle_sources` are digested; apart(case, key,
    entry, here): a missing answer computed elsewhere, written to `entry` under the project's own `key`
    and read back, or None (`oracle_process.compute_apart`, which calls `here()` where its process cannot
    run). `hits`, `misses` and `rejected` count lookups; a hit's `execute_s` is its load time. An
    unwritable folder only logs a warning. Safe from several threads (`LookupCounts`).
    """

    def __init__(
        self,
        folder: pathlib.Path | None = None,
        compute: Callable[[object, object], OracleOutputs] = run_oracle_path,
        source_root: pathlib.Path = PROJECT_ROOT,
        apart: Callable[[object, dict, pathlib.Path, Callable[[], OracleOutputs]], OracleOutputs | None] | None = None,
    ):
        super().__init__()
        self.folder = pathlib.Path(folder) if folder is not None else default_folder()
        self.compute = compute
        self.source_digest = oracle_source_digest(source_root)
        self.apart = apart

    def counts(self) -> dict[str, int]:
        """Answers this cache computed and loaded, for the run's metadata."""
        return {"oracle_computed": self.misses, "oracle_cached": self.hits}

    def __call__(self, case, fixture) -> OracleOutputs:
        start = time.perf_counter()
        material = key_material(case, fixture, self.source_digest)
        for key in read_keys(material):  # the project's own entry, then this process's (foreign code)
            path = self._entry_path(key)
            if not path.exists():
                continue
            try:
                outputs = deserialize(path, key)
                self._count(hits=1)
                return dataclasses.replace(outputs, execute_s=time.perf_counter() - start)
            except CorruptOracleEntry as error:
                self._count(rejected=1)
                log.warning("oracle cache entry %s for case %r is invalid (%s); recomputing", path, case.name, error)
        self._count(misses=1)
        # A large case in a process of its own, which loads no foreign code: its answer is the
        # project's own, stored under the project's key whatever this process loaded. Where that
        # process cannot run, `apart` computes it here (`_computed_here`), under this process's key.
        if self.apart is not None and self.compute is run_oracle_path:
            entry = self._entry_path(material)
            outputs = self.apart(case, material, entry, lambda: self._computed_here(case, fixture, material))
            if outputs is not None:
                return dataclasses.replace(outputs, execute_s=time.perf_counter() - start)
        return dataclasses.replace(self._computed_here(case, fixture, material), execute_s=time.perf_counter() - start)

    def _computed_here(self, case, fixture, material: dict) -> OracleOutputs:
        """The answer computed in this process, stored under its key (`write_key`: with the
        foreign code's record where it loaded some; not stored where that code cannot be recorded)."""
        outputs = self.compute(case, fixture)
        key = write_key(material)
        if key is not None:
            path = self._entry_path(key)
            try:
                atomic_write(path, serialize(key, outputs))
            except OSError as error:
                log.warning("could not write oracle cache entry %s: %s", path, error)
        return outputs

    def _entry_path(self, key: dict) -> pathlib.Path:
        return self.folder / f"oracle-{key_digest(key)}.npz"
