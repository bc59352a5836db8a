"""Disk stores of the compiled path programs and of the kernels' TPU lowering results.

JAX's persistent compilation cache saves XLA's compile, but finding an entry there
means tracing and lowering the program first, in Python, for every program of every
run. These stores key a program by what it is *made of* instead —
the code it is traced from, the case's trace signature, the arguments' shapes, dtypes
and shardings, the devices, the library versions and XLA flags — so a warm run loads a
serialised executable without tracing anything.

The code a program is made of is the import closure of the module that builds programs
(`program_sources`, `mhc_parity.records.code.import_closure` of `PROGRAM_ENTRY`), less the oracle's
modules, and less the kernels' for a path that does not run them (the operation says
which those are: `mhc_parity.harness.engine.operation`). So an edit to a kernel misses only the
kernel paths' programs; the reference programs still load. tests/test_program_store.py
traces every built-in path and fails if code from a file outside its sources ran.
External implementations (`--impl`) are never stored: their sources are not known; they
go through JAX's own cache. And a process that loaded
one stores nothing at all (`mhc_parity.records.foreign_code`, which every store's write asks):
importing it may have patched any module, so a built-in program it traced is not vouched for
by its sources; it still loads what clean processes stored.

Trust: a stored program is only as current as its sources. A process that
patches functions at run time (the kill matrix's faults, tests with monkeypatch) must
not use the stores while the patch is in: `ProgramCache()` and `Runner(...)` use none
unless given one (`mhc-parity run`, its workers and `mhc_parity.harness.api` do), and
while a block of `code_patched()` runs (every `mhc_parity.harness.faults.model.Perturbation`
injection is one) no store loads or saves anything, whoever asks: the kill matrix's clean
passes load their programs, its perturbed passes never see a stored one, nor store theirs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import pickle
import platform
import threading
import time
from collections.abc import Iterator

import flax
import jax
import jaxlib
import numpy as np
from jax._src import config as jax_config  # the thread-local cache-write threshold; no public handle
from jax.experimental import serialize_executable

from mhc_parity.harness.engine.implementations import is_builtin
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.env import compiler_material
from mhc_parity.harness.stores.artifact_store import ArtifactStore
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.kernels.lowering import LoweringResult
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import closure_digest, import_closure

log = logging.getLogger(__name__)

# Bump when an entry's layout or its key material changes meaning.
STORE_FORMAT = 2
# The module that builds every path's program, and the one that lowers the kernels for TPU.
PROGRAM_ENTRY = ("mhc_parity.harness.engine.paths",)
LOWERING_ENTRY = (*PROGRAM_ENTRY, "mhc_parity.mhc.kernels.lowering")
# XLA's default value of a debugging option: the program is unchanged (tested bit for bit
# against a plain compile), but JAX's persistent cache keys the compile apart (see
# `ProgramStore.compile`).
_FRESH_COMPILE_OPTIONS = {"xla_embed_ir_in_executable": False}
# JAX settings that change what a traced program is.
_JAX_SETTINGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_numpy_dtype_promotion",
    "jax_threefry_partitionable",
)


# Blocks of `code_patched` open in this process (any thread): while one is, the stores are shut.
_patched = 0
_patched_lock = threading.Lock()


@contextlib.contextmanager
def code_patched() -> Iterator[None]:
    """Shut the program and lowering stores for the block: code in this process is patched at
    run time (a fault injected), so a stored program is not the one its trace would make, and
    one it makes is not its sources'. Blocks nest; the stores open when the last one ends."""
    global _patched
    with _patched_lock:
        _patched += 1
    try:
        yield
    finally:
        with _patched_lock:
            _patched -= 1


def stores_open() -> bool:
    """False while a `code_patched` block runs in this process."""
    return _patched == 0


def program_sources(kernel: bool) -> tuple[str, ...]:
    """Project files a built-in path's program is traced from (`kernel`: a Pallas path)."""
    return import_closure(PROGRAM_ENTRY, _not_traced(kernel))


def _not_traced(kernel: bool) -> tuple[str, ...]:
    return OPERATION.ORACLE_MODULES + (() if kernel else OPERATION.KERNEL_MODULES)


@functools.cache
def traced_sources_digest(entries: tuple[str, ...], exclude: tuple[str, ...]) -> str | None:
    """`mhc_parity.records.code.closure_digest` of `entries` less `exclude`, or None — with one warning
    — when the sources are not on disk (e.g. a zipped install): then nothing is stored.
    Cached per process: the run's code does not change under it (and the manifest records
    what it was)."""
    try:
        return closure_digest(entries, exclude)
    except FileNotFoundError as error:
        log.warning("compiled programs and TPU lowerings are not stored: %s", error)
        return None


def environment_material() -> dict:
    """Library versions, XLA flags, JAX settings and the host CPU: what else shapes a program."""
    return {
        "versions": {
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "flax": flax.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "jax_settings": {name: str(getattr(jax.config, name)) for name in _JAX_SETTINGS},
        **compiler_material(),
    }


def _jsonable(value):
    return json.loads(json.dumps(value, default=str))


def _argument_material(args) -> dict:
    leaves, treedef = jax.tree.flatten(args)
    return {
        "tree": str(treedef),
        "leaves": [[list(leaf.shape), str(leaf.dtype), str(leaf.sharding)] for leaf in leaves],
    }


class ProgramStore:
    """Compiled path programs on disk (``<cache>/programs``), for built-in implementations.

    `load(...)` / `save(...)` take what `mhc_parity.harness.engine.program_cache.ProgramCache` knows of a program;
    `hits`, `misses` and `rejected` count this object's lookups (`store.hits` ...).
    """

    def __init__(self, folder=None):
        self.store = ArtifactStore(folder if folder is not None else cache_root() / "programs", "program")

    @staticmethod
    def material(path, signature: tuple, args, placement) -> dict | None:
        """The key material of a path's program, or None if it must be neither loaded nor stored
        (an external implementation's, or one traced while code is patched: `code_patched`)."""
        impl = path.impl
        if not is_builtin(impl) or not stores_open():
            return None
        sources = traced_sources_digest(PROGRAM_ENTRY, _not_traced(impl.kernel))
        if sources is None:
            return None
        return _jsonable(
            {
                "format": STORE_FORMAT,
                "path": path.name,
                "implementation": {"kernel": impl.kernel, "interpret": impl.interpret},
                "signature": list(signature),
                "arguments": _argument_material(args),
                "devices": [[d.platform, d.device_kind, d.id] for d in placement.devices],
                "device_count": jax.device_count(),
                "environment": environment_material(),
                "sources": sources,
            }
        )

    def load(self, material: dict, placement):
        """The stored executable (a `jax.stages.Compiled`) for `material`, or None.

        Raises the stored `UnsupportedInputError` if tracing this program rejected its input
        (`save_rejection`): a rejection is as much a function of the key as a program is.
        """
        payload = self.store.load(material)
        if payload is None:
            return None
        try:
            kind, *content = pickle.loads(payload)
        except Exception as error:  # noqa: BLE001 - a verified entry this code cannot read
            self.store.reject(material, f"{type(error).__name__}: {error}")
            return None
        if kind == "rejected":
            raise UnsupportedInputError(content[0])
        try:
            serialized, in_tree, out_tree = content
            return serialize_executable.deserialize_and_load(
                serialized,
                in_tree,
                out_tree,
                backend=placement.devices[0].client,
                execution_devices=list(placement.devices),
            )
        except Exception as error:  # noqa: BLE001 - a verified entry this jaxlib cannot load: recompile
            self.store.reject(material, f"{type(error).__name__}: {error}")
            return None

    @staticmethod
    def compile(lowered):
        """XLA's compile of `lowered` (a `jax.stages.Lowered`), never served by JAX's persistent cache.

        An executable JAX loaded from its cache does not serialise whole on the pinned jaxlib:
        stored again, it fails in the next process ("Function <fusion> not found"). So a
        stored program is always compiled here: `_FRESH_COMPILE_OPTIONS` key JAX's cache apart
        from every other compile, and no entry is written under that key, so it never hits.
        """
        with jax_config.persistent_cache_min_compile_time_secs(math.inf):
            return lowered.compile(compiler_options=_FRESH_COMPILE_OPTIONS)

    def save(self, material: dict, compiled) -> None:
        """Store `compiled`; programs JAX cannot serialise (closed-over constants) are left out."""
        try:
            payload = pickle.dumps(("program", *serialize_executable.serialize(compiled)))
        except (ValueError, NotImplementedError):
            return
        self.store.save(material, payload)

    def save_rejection(self, material: dict, error: UnsupportedInputError) -> None:
        """Store that tracing the program rejected its input, with the error's message."""
        self.store.save(material, pickle.dumps(("rejected", str(error))))

    def counts(self) -> dict[str, int]:
        return {"programs_stored_loaded": self.store.hits, "programs_stored_missed": self.store.misses}


class LoweringStore:
    """The kernels' TPU lowering results on disk (``<cache>/lowering``), keyed like programs.

    lower(arguments, compute): `arguments` is a JSON-able dict of everything the
    lowering is called with; `compute()` returns the list of `LoweringResult`s. A hit
    returns the stored results with `seconds` = this lookup's share of its load time.
    """

    def __init__(self, folder=None):
        self.store = ArtifactStore(folder if folder is not None else cache_root() / "lowering", "lowering")

    def lower(self, arguments: dict, compute):
        if not stores_open():  # code is patched: neither a stored result nor this one is its sources'
            return compute()
        start = time.perf_counter()
        sources = traced_sources_digest(LOWERING_ENTRY, _not_traced(kernel=True))
        if sources is None:
            return compute()
        material = _jsonable(
            {
                "format": STORE_FORMAT,
                "arguments": arguments,
                "environment": environment_material(),
                "sources": sources,
            }
        )
        payload = self.store.load(material)
        if payload is not None:
            stored = json.loads(payload)
            share = (time.perf_counter() - start) / max(len(stored), 1)
            return [LoweringResult(r["program"], r["ok"], r["error"], share) for r in stored]
        results = compute()
        self.store.save(material, json.dumps([dataclasses.asdict(r) for r in results]).encode())
        return results

    def counts(self) -> dict[str, int]:
        return {"lowerings_stored_loaded": self.store.hits, "lowerings_stored_missed": self.store.misses}
