"""Disk stores of the compiled path programs and of the kernels' TPU lowering results, so that a warm run
loads a serialised executable without tracing (JAX's persistent cache traces and lowers first). A
built-in program is keyed by what it is made of: its sources (`program_sources`, less the oracle's
modules, and the kernels' for a path that runs none), the trace signature, the arguments' shapes,
dtypes and shardings, the devices and the environment (`store_keys.environment_material`). A program
foreign code may have shaped (an external implementation's, any in a process that loaded foreign code)
is keyed by what it computes (`computed_material`: its jaxpr, else its lowered module); one that calls
back into Python is never stored. While code is patched (`code_patched()`) no store loads or saves
anything."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pickle
import threading
import time

import jax
from jax._src import config as jax_config  # the thread-local cache-write threshold; no public handle
from jax.experimental import serialize_executable

from mhc_parity.harness.engine.implementations import is_builtin
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.engine.store_keys import (
    environment_material,
    implementation_case_material,
    implementation_material,
    jsonable,
    traced_sources_digest,
)
from mhc_parity.harness.engine.traced_digest import traced_digest
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.kernels.lowering import LoweringResult
from mhc_parity.records.artifact_store import ArtifactStore
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import import_closure
from mhc_parity.records.foreign_code import foreign_code, stores_open

# Bump when an entry's layout or its key material changes meaning.
STORE_FORMAT = 3
# The module that builds every path's program, and the one that lowers the kernels for TPU.
PROGRAM_ENTRY = ("mhc_parity.harness.engine.paths",)
LOWERING_ENTRY = (*PROGRAM_ENTRY, "mhc_parity.mhc.kernels.lowering")
# XLA's default value of a debugging option: the program is unchanged (tested bit for bit
# against a plain compile), but JAX's persistent cache keys the compile apart (see
# `ProgramStore.compile`).
_FRESH_COMPILE_OPTIONS = {"xla_embed_ir_in_executable": False}


def program_sources(kernel: bool) -> tuple[str, ...]:
    """Project files a built-in path's program is traced from (`kernel`: a Pallas path)."""
    return import_closure(PROGRAM_ENTRY, _not_traced(kernel))


def _not_traced(kernel: bool) -> tuple[str, ...]:
    return OPERATION.ORACLE_MODULES + (() if kernel else OPERATION.KERNEL_MODULES)


def stored_results(store: ArtifactStore, material: dict, traced: tuple, result_type, compute) -> list:
    """`compute()`'s list of `result_type` records (dataclasses with `seconds`) through `store`,
    keyed by `material` (JSON-able: what they are made from), the stores' format, the environment
    and the sources traced from `traced` = (entries, modules left out); computed and not stored
    while code is patched (neither a stored result nor this one is its sources') or where the
    sources cannot be read. A hit's `seconds` is this lookup's share of its load time."""
    if not stores_open():
        return compute()
    start = time.perf_counter()
    sources = traced_sources_digest(*traced)
    if sources is None:
        return compute()
    key = jsonable({"format": STORE_FORMAT, **material, "environment": environment_material(), "sources": sources})
    payload = store.load(key)
    if payload is not None:
        stored = json.loads(payload)
        share = (time.perf_counter() - start) / max(len(stored), 1)
        return [result_type(**{**fields, "seconds": share}) for fields in stored]
    results = compute()
    store.save(key, json.dumps([dataclasses.asdict(r) for r in results]).encode())
    return results


def _argument_material(args) -> dict:
    leaves, treedef = jax.tree.flatten(args)
    return {
        "tree": str(treedef),
        "leaves": [[list(leaf.shape), str(leaf.dtype), str(leaf.sharding)] for leaf in leaves],
    }


def keyed_by_program(impl) -> bool:
    """Whether a program of `impl` is keyed by what it computes (`computed_material`), not by the project's
    sources: an external implementation's, or any in a process that loaded foreign code."""
    return not is_builtin(impl) or bool(foreign_code())


def has_host_callbacks(lowered) -> bool:
    """Whether a lowered program (`jax.stages.Lowered`) calls back into Python."""
    # `compile_args` is JAX's private record of what the lowering hands XLA; no public handle
    # says whether a program has host callbacks (docs/jax-notes.md).
    return bool(getattr(lowered._lowering, "compile_args", {}).get("host_callbacks"))


def program_digest(lowered) -> str | None:
    """What a lowered program (`jax.stages.Lowered`) computes, as a sha256: its StableHLO text
    without source locations (every constant written out: MLIR prints large ones whole) and
    its argument and result trees. None for a program that calls back into Python (a
    `jax.pure_callback`, `jax.debug.print`): the text names its callback by index, not its
    code, so its results are no function of the text."""
    if has_host_callbacks(lowered):
        return None
    digest = hashlib.sha256(lowered.as_text(debug_info=False).encode())
    digest.update(f"\n{lowered.in_tree}\n{lowered.out_tree}".encode())
    return digest.hexdigest()


def computed_material(traced, lower) -> tuple[dict | None, object | None]:
    """(what a traced program computes as key material, its lowering where that was needed): its jaxpr's
    `traced_digest` ({"jaxpr": sha256}, nothing lowered) where every part is a value, else its lowered
    module's `program_digest` ({"program": sha256}, the lowering returned); None for a program that
    calls back into Python. One keyed by its jaxpr is stored only if its lowering on a miss has no host
    callback (`ProgramStore.save`)."""
    digest = traced_digest(traced)
    if digest is not None:
        return {"jaxpr": digest}, None
    lowered = lower(traced)
    digest = program_digest(lowered)
    return (None if digest is None else {"program": digest}), lowered


class ProgramStore:
    """Compiled path programs on disk (``<cache>/programs``), for `ProgramCache`; `hits`, `misses` and
    `rejected` count lookups; `counts()` adds the programs traced (and lowered) to key them."""

    def __init__(self, folder=None):
        self.store = ArtifactStore(folder if folder is not None else cache_root() / "programs", "program")
        # Programs traced to key them, those of them also lowered, their seconds (from any thread).
        self._keyed = [0, 0, 0.0]
        self._keyed_lock = threading.Lock()

    def keyed(self, seconds: float, lowered: bool) -> None:
        """Count one program traced (and, where `lowered`, lowered) in `seconds` to compute its
        key (`computed_material`): on a warm run that is all the work a program keyed by what it
        computes costs before it loads."""
        with self._keyed_lock:
            self._keyed[0] += 1
            self._keyed[1] += int(lowered)
            self._keyed[2] += seconds

    @staticmethod
    def material(path, signature: tuple, args, placement, computed: dict | None = None) -> dict | None:
        """The key material of a path's program, or None if it must be neither loaded nor stored
        (its code cannot be read, it calls back into Python, or it is traced while code is
        patched: `code_patched`). computed: what the program computes (`computed_material`),
        which a path `keyed_by_program` is keyed by (None there: nothing is stored); unused
        otherwise."""
        if not stores_open():
            return None
        impl = path.impl
        common = {
            "format": STORE_FORMAT,
            "arguments": _argument_material(args),
            "devices": [[d.platform, d.device_kind, d.id] for d in placement.devices],
            "environment": environment_material(),
        }
        if keyed_by_program(impl):
            return None if computed is None else jsonable({**common, **computed})
        implementation = implementation_material(impl)
        sources = traced_sources_digest(PROGRAM_ENTRY, _not_traced(impl.kernel))
        if sources is None or implementation is None:
            return None
        return jsonable(
            {
                **common,
                "path": path.name,
                "implementation": implementation,
                "signature": list(signature),
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
        """XLA's compile of `lowered`, never served by JAX's persistent cache: an executable JAX loaded from it
        does not serialise whole on the pinned jaxlib ("Function <fusion> not found" in the next process), so
        `_FRESH_COMPILE_OPTIONS` key this compile apart, under a key no entry is written to."""
        with jax_config.persistent_cache_min_compile_time_secs(math.inf):
            return lowered.compile(compiler_options=_FRESH_COMPILE_OPTIONS)

    def save(self, material: dict, compiled, lowered=None) -> None:
        """Store `compiled` (compiled from `lowered`, where given); programs that call back into
        Python (`has_host_callbacks`: the callback's code is no part of the key) and programs JAX
        cannot serialise (closed-over constants, a callback's local function: AttributeError
        from pickle) are left out."""
        if lowered is not None and has_host_callbacks(lowered):
            return
        try:
            payload = pickle.dumps(("program", *serialize_executable.serialize(compiled)))
        except (ValueError, NotImplementedError, AttributeError, pickle.PicklingError):
            return
        self.store.save(material, payload)

    def save_rejection(self, material: dict, error: UnsupportedInputError) -> None:
        """Store that tracing the program rejected its input, with the error's message."""
        self.store.save(material, pickle.dumps(("rejected", str(error))))

    def counts(self) -> dict[str, int | float]:
        with self._keyed_lock:
            traced, lowered, keyed_s = self._keyed
        return {
            "programs_stored_loaded": self.store.hits,
            "programs_stored_missed": self.store.misses,
            "programs_traced_to_key": traced,
            "programs_lowered_to_key": lowered,
            "program_keys_s": round(keyed_s, 3),
        }


class LoweringStore:
    """The kernels' TPU lowering results on disk (``<cache>/lowering``), keyed like programs: `lower` takes
    the JSON-able arguments of the lowering and `compute()` giving its `LoweringResult`s; a hit's
    `seconds` is this lookup's share of its load time."""

    def __init__(self, folder=None):
        self.store = ArtifactStore(folder if folder is not None else cache_root() / "lowering", "lowering")

    def lower(self, arguments: dict, compute):
        return stored_results(
            self.store, {"arguments": arguments}, (LOWERING_ENTRY, _not_traced(kernel=True)), LoweringResult, compute
        )

    def lower_implementation(self, impl, case, mesh_shape: tuple[int, ...], compute):
        """`lower` for the kernel programs an implementation lowers itself (`Implementation.lower`
        of `case` on `mesh_shape`): keyed by what it is (`implementation_material`) and every
        field of the case but its labels (what `impl.lower` is given); computed, not stored,
        where its code cannot be read."""
        material = implementation_case_material(impl, case)
        if material is None:
            return compute()
        return self.lower({**material, "mesh_shape": list(mesh_shape)}, compute)

    def counts(self) -> dict[str, int]:
        return {"lowerings_stored_loaded": self.store.hits, "lowerings_stored_missed": self.store.misses}
