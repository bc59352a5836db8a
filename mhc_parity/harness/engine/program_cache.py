"""The cache of compiled path programs, keyed by (path name, trace signature) so that cases of one shape
and dtype share them: the most recent in memory, a `ProgramStore` across processes. The builders are
called through the `paths` module (`path_programs`), so what patches them there (a test, a fault
seam) patches what this cache calls."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import os
import threading
import time

import jax
import numpy as np

import mhc_parity.harness.engine.paths as path_programs
from mhc_parity.cases.spec import mesh_label
from mhc_parity.harness.engine.devices import path_placement
from mhc_parity.harness.engine.execution_timing import device_time, first_call
from mhc_parity.harness.engine.paths import Path, PathOutputs
from mhc_parity.harness.engine.program_store import computed_material, keyed_by_program
from mhc_parity.harness.engine.quiet import QUIET
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.records.roofline import array_bytes

# Each XLA:CPU executable holds its own memory mappings, capped per process by vm.max_map_count: an
# unbounded cache ran the kill matrix's full-suite clean pass out of them (then a segfault). Cases
# reuse a program only while their shape repeats.
MAX_CACHED_PROGRAMS = 48
# The parts of obtaining a program the run's metadata times (beside the store's `program_keys_s`):
# loading it from the store, tracing and lowering it (Python, holding the GIL), XLA's compile.
OBTAIN_PARTS = ("programs_load_s", "programs_trace_s", "programs_compile_s")
# Threads that obtain programs at once (`ProgramCache.compile_ahead`): XLA's compile uses
# about one core each and releases the GIL.
COMPILE_THREADS = max(1, os.cpu_count() or 1)


class ProgramCache:
    """Compiled path programs keyed by (path name, trace signature), the `max_programs` most recently used
    kept (an evicted one is compiled or loaded again). store: a `ProgramStore` for built-in paths'
    programs (None: compile every program this process needs). `compile_ahead` obtains programs in a
    thread pool and `run` waits for the one it needs. Safe to use from several threads."""

    # Its capabilities as the runner's `PathPrograms` (mhc_parity.harness.engine.collaborators).
    compiles_ahead = True
    times_on_device = True

    def __init__(self, max_programs: int = MAX_CACHED_PROGRAMS, store=None):
        if max_programs < 1:
            raise ValueError(f"max_programs must be at least 1, got {max_programs}")
        self.max_programs = max_programs
        self.store = store
        self._lock = threading.Lock()
        self._compiled: collections.OrderedDict[tuple, object] = collections.OrderedDict()
        # key -> future of `_timed(self._obtain, ...)` (program, error, seconds), from
        # `compile_ahead`; the first `run` of the key takes it.
        self._pending: dict[tuple, concurrent.futures.Future] = {}
        # Seconds obtaining programs took per part (`OBTAIN_PARTS`), summed over threads.
        self._obtain_s = dict.fromkeys(OBTAIN_PARTS, 0.0)

    def clear(self) -> None:
        with self._lock:
            self._compiled.clear()
            self._pending.clear()

    def __len__(self) -> int:
        """Programs kept, and those obtained ahead (or under way) that no `run` took yet."""
        with self._lock:
            return len(self._compiled) + len(self._pending)

    def counts(self) -> dict[str, int | float]:
        """What its program store loaded and missed, and the seconds each part of obtaining the
        programs took ({} without a store), for the run's metadata."""
        if self.store is None:
            return {}
        with self._lock:
            return {**self.store.counts(), **{part: round(s, 3) for part, s in self._obtain_s.items()}}

    @contextlib.contextmanager
    def _timing(self, part: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._obtain_s[part] += time.perf_counter() - start

    def lookup(self, key: tuple) -> object | None:
        """The compiled program of `key` (now the most recently used), or None."""
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
            return compiled

    def remember(self, key: tuple, compiled: object) -> None:
        """Keep `compiled` under `key`, dropping the least recently used beyond `max_programs`."""
        with self._lock:
            self._compiled[key] = compiled
            self._compiled.move_to_end(key)
            while len(self._compiled) > self.max_programs:
                self._compiled.popitem(last=False)

    def _resolve(self, path: Path, case):
        """(cache key, placement, precision) of `path` running `case`; the fixture is placed
        (`_place`) only where a program is obtained or run."""
        if path.mesh is not None:
            batch, sequence = case.batch, case.sequence
            if batch % path.mesh[0] or sequence % path.mesh[1]:
                raise ValueError(
                    f"case {case.name}: batch {batch} / sequence {sequence} not divisible by mesh "
                    f"{mesh_label(path.mesh)}"
                )
        placement = path_placement(path)
        precision = path_programs.effective_precision(case, placement)
        return (path.name, path_programs._trace_signature(case, precision)), placement, precision

    def _obtain(self, path: Path, case, key, placement, precision, args):
        """The compiled program: loaded from the store, or traced, lowered and compiled (and stored). A
        program keyed by what it computes (`keyed_by_program`) is traced first, once, and keyed by its jaxpr
        (or its lowering: `computed_material`). Raises `UnsupportedInputError` where the program rejects its
        input (stored too where the program is keyed by its sources)."""
        traced = lowered = computed = None
        if self.store is not None and keyed_by_program(path.impl):
            start = time.perf_counter()
            try:
                traced = self._trace(path, case, placement, precision, args)
                computed, lowered = computed_material(traced, functools.partial(self._lower_traced, placement))
            finally:  # a program whose tracing raises cost its seconds too
                self.store.keyed(time.perf_counter() - start, lowered is not None)
        material = self.store.material(path, key[1], args, placement, computed) if self.store else None
        if material is not None:
            with self._timing("programs_load_s"):
                compiled = self.store.load(material, placement)
            if compiled is not None:
                return compiled
        if lowered is None:
            try:
                with self._timing("programs_trace_s"):
                    if traced is None:
                        traced = self._trace(path, case, placement, precision, args)
                    lowered = self._lower_traced(placement, traced)
            except UnsupportedInputError as error:  # the next run rejects without tracing
                if material is not None:
                    self.store.save_rejection(material, error)
                raise
        with self._timing("programs_compile_s"):
            if material is None:
                return lowered.compile()
            compiled = self.store.compile(lowered)
        self.store.save(material, compiled, lowered)
        return compiled

    @staticmethod
    def _trace(path: Path, case, placement, precision, args):
        """`path`'s program for `case` traced (`jax.stages.Traced`) on `args`."""
        # Anything the tracing builds eagerly lands on the path's device.
        with jax.default_device(placement.devices[0]):
            return jax.jit(path_programs._build_program(path, case, placement, precision)).trace(*args)

    @staticmethod
    def _lower_traced(placement, traced):
        """`traced` lowered (`jax.stages.Lowered`), on the path's device as it was traced."""
        with jax.default_device(placement.devices[0]):
            return traced.lower()

    def compile_ahead(self, pool: concurrent.futures.Executor, paths, case, fixture) -> None:
        """Start obtaining in `pool` the programs `paths` need for `case` that are neither compiled nor under
        way, without waiting (XLA compiles with the GIL released). A path that cannot be placed, or whose
        inputs cannot be put on its devices, is left for `run` to report, as is a program that fails to build."""
        for path in paths:
            try:
                key, placement, precision = self._resolve(path, case)
            except Exception:  # noqa: BLE001 - reported when the path runs
                continue
            with self._lock:
                if key in self._compiled or key in self._pending:
                    continue
                try:
                    args = path_programs._place(fixture, path, placement)
                except Exception:  # noqa: BLE001 - `run` places them again and reports what it meets
                    continue
                # background work: a path timed alone waits for it (`mhc_parity.harness.engine.quiet`)
                self._pending[key] = pool.submit(
                    QUIET.run_in_background, _timed, self._obtain, path, case, key, placement, precision, args
                )

    def prepare(self, paths, case, fixture) -> None:
        """Compile the programs `paths` will need for `case` concurrently, and wait for them (those
        obtained ahead in another pool too)."""
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_THREADS)
        try:
            self.compile_ahead(pool, paths, case, fixture)
            pool.shutdown(wait=True)
            concurrent.futures.wait(self._pending_for(paths, case))
        except BaseException:  # Ctrl-C above all: a thread stuck in the code under test is not waited for
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    def _pending_for(self, paths, case) -> list[concurrent.futures.Future]:
        """The futures of `paths`' programs for `case` still obtained ahead (none for a path that
        cannot be placed: `run` reports it)."""
        keys = []
        for path in paths:
            try:
                keys.append(self._resolve(path, case)[0])
            except Exception:  # noqa: BLE001 - reported when the path runs
                continue
        with self._lock:
            return [self._pending[key] for key in keys if key in self._pending]

    def settle_pending(self, *, grace_s: float = 0.0) -> None:
        """Keep the programs obtained ahead that no `run` took yet, waiting at most `grace_s` for those still
        compiling and dropping the rest (a later `run` obtains its own): for the owner of a pool shutting down."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if grace_s > 0 and pending:
            concurrent.futures.wait(pending.values(), timeout=grace_s)
        for key, future in pending.items():
            if future.done() and not future.cancelled():
                compiled, _, _ = future.result()
                if compiled is not None:
                    self.remember(key, compiled)

    def _take_pending(self, key) -> tuple[object | None, BaseException | None, float]:
        """(program, error, seconds) obtained ahead for `key`, waiting for it; (None, None, 0)
        if nothing was (or a shut-down pool cancelled it)."""
        with self._lock:
            future = self._pending.pop(key, None)
        if future is None:
            return None, None, 0.0
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            return None, None, 0.0

    def run(self, path: Path, case, fixture) -> PathOutputs:
        """Run `case`'s fixture through `path` once, obtaining its program on first use of the signature.

        compile_s: the seconds obtaining the program took (in a pool thread if obtained ahead), reported by
        its first run only; execute_s: this call's (dispatch and wait), which the runner replaces by
        `device_time`'s on an accelerator; bytes_moved: the program's arguments and results. Raises
        `PlacementError` where the path has no devices here.
        """
        key, placement, precision = self._resolve(path, case)
        args = path_programs._place(fixture, path, placement)
        compiled, error, compile_s = self._take_pending(key)
        if error is not None:
            raise error
        if compiled is None:
            compiled, compile_s = self.lookup(key), 0.0
        if compiled is None:
            start = time.perf_counter()
            compiled = self._obtain(path, case, key, placement, precision, args)
            compile_s = time.perf_counter() - start
        self.remember(key, compiled)
        with jax.default_device(placement.devices[0]):
            (leaves, output_bytes), first_s = first_call(
                lambda: jax.block_until_ready(compiled(*args)),
                lambda outputs: (host_leaves(outputs), array_bytes(jax.tree.leaves(outputs))),
            )
        bytes_moved = array_bytes(jax.tree.leaves(args)) + output_bytes
        return PathOutputs(leaves, compile_s, first_s, first_s, 1, float(bytes_moved))

    def device_time(self, path: Path, case, fixture) -> tuple[float, int]:
        """(seconds per run, runs) of `path`'s program on `case`'s fixture, timed back to back
        (`mhc_parity.harness.engine.execution_timing.device_time`), after `run` ran it. The
        caller keeps the process quiet (`mhc_parity.harness.engine.quiet.QUIET.alone`)."""
        key, placement, precision = self._resolve(path, case)
        args = path_programs._place(fixture, path, placement)
        compiled = self.lookup(key)
        if compiled is None:  # evicted since its run (more paths than the cache keeps)
            compiled = self._obtain(path, case, key, placement, precision, args)
            self.remember(key, compiled)
        with jax.default_device(placement.devices[0]):
            return device_time(lambda: compiled(*args), jax.block_until_ready)


def host_leaves(outputs) -> dict[str, np.ndarray]:
    """A program's (forward leaves, gradient leaves) as one mapping of host arrays."""
    forward, grads = outputs
    return {name: np.asarray(value) for name, value in {**forward, **grads}.items()}


def _timed(function, *args):
    """(function(*args), None, seconds), or (None, the exception, seconds) if it raised."""
    start = time.perf_counter()
    try:
        result, error = function(*args), None
    except Exception as exc:  # noqa: BLE001 - raised again by the `run` that takes it
        result, error = None, exc
    return result, error, time.perf_counter() - start
