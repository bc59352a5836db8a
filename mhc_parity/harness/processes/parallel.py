"""`mhc-parity run --jobs N`: the runner's cases spread over N worker processes. `ParallelRunner` has
`Runner`'s `run` interface, so the row stream, manifest, reports and Ctrl-C are the single-process
run's; a case's rows are what one process would make, yielded in selection order. Workers fork from
a server that never started JAX (`worker_processes`), share the cache folder, ignore SIGINT (the
parent handles it and terminates them) and end with the parent however it ends."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import signal
from collections.abc import Iterable, Iterator

import jax

from mhc_parity.harness.engine.case_cost import costliest_first, pass_cost
from mhc_parity.harness.engine.implementations import BUILTIN, load_externals
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.run_info import enable_compilation_cache
from mhc_parity.harness.engine.runner import TIMINGS, Runner, StepCallback, _no_step
from mhc_parity.harness.env import backend_started, ensure_host_devices, pace_garbage_collector
from mhc_parity.harness.errors import ResourceError
from mhc_parity.harness.processes.step_relay import StepRelay, poster
from mhc_parity.harness.processes.worker_processes import (
    adopt_environment,
    available_memory_bytes,
    end_with_parent,
    environment_of_this_process,
    exit_with,
    peak_resident_bytes,
    start_worker_server,
    worker_context,
)
from mhc_parity.records.foreign_code import adopt_records, known_records

# Resident memory a worker may need: the largest worker of a cold default-suite run
# (`make bench`, --jobs 2, the peak memory line), with a quarter more for margin.
WORKER_MEMORY_BYTES = int(3.0 * 2**30)


def auto_jobs(case_count: int) -> int:
    """`--jobs auto`: a worker per CPU core when the paths run on the CPU, no more than the available memory
    holds (`WORKER_MEMORY_BYTES` each) or there are cases; 1 on an accelerator, which one process owns.
    Workers beat one process's threads, which share one GIL (`make bench` measures both)."""
    if jax.default_backend() != "cpu":
        return 1
    cores = os.cpu_count() or 1
    memory = available_memory_bytes()
    by_memory = cores if memory is None else memory // WORKER_MEMORY_BYTES
    return max(1, min(cores, by_memory, case_count))


class WorkerError(ResourceError):
    """A worker process died without an answer (killed, e.g. for memory, or crashed in native code)."""


@dataclasses.dataclass(frozen=True)
class _WorkerSpec:
    """What a worker needs to rebuild the parent's runner and plan (all picklable)."""

    policy: object
    impl_specs: tuple[str, ...]
    path_globs: tuple[str, ...]
    lowering: bool
    causes: bool
    environment: tuple[tuple[str, str], ...]  # the parent's os.environ
    parent_pid: int  # the command's process: the worker ends with it
    # The parent's records of the external code (`mhc_parity.records.foreign_code.known_records`):
    # read once, for the manifest; the workers' store keys hold the same.
    code_records: tuple = ({}, [])


_WORKER: dict = {}


def _start_worker(spec: _WorkerSpec, steps=None) -> None:
    """A worker's initializer: the parent's environment, XLA flags before JAX starts, the
    collector paced, caches on, runner and plan built; `steps`: the queue its cases' stages
    go to (`mhc_parity.harness.processes.step_relay`), or None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_with_parent()  # the fork server: killed when the command ends, whatever this worker runs then
    exit_with(spec.parent_pid)  # where the kernel cannot see to it, and if the command ended already
    if backend_started():  # forked from a process whose JAX runtime had started
        raise RuntimeError("a worker process began with a JAX backend already started; it must start none")
    adopt_environment(spec.environment)
    ensure_host_devices()
    pace_garbage_collector()
    enable_compilation_cache()
    externals = load_externals(spec.impl_specs)
    adopt_records(spec.code_records)
    _WORKER["runner"] = Runner.with_disk_stores(spec.policy)
    if steps is not None:
        steps.cancel_join_thread()  # a worker's exit never waits on progress messages
        _WORKER["on_step"] = poster(steps)
    _WORKER["plan"] = PathPlan(
        implementations=tuple(BUILTIN.values()) + externals,
        path_globs=spec.path_globs,
        lowering=spec.lowering,
        causes=spec.causes,
    )


def _run_case(case) -> tuple[list[dict], dict, dict, int | None]:
    """One case in a worker: its rows, the seconds and counts (`Runner.work_counts`) it
    added, and the worker's peak resident memory so far (bytes, None where unknown)."""
    runner: Runner = _WORKER["runner"]
    timings, counts = dict(runner.timings), runner.work_counts()
    rows = list(runner.run_case(case, _WORKER["plan"], _WORKER.get("on_step", _no_step)))
    added_timings = {k: v - timings[k] for k, v in runner.timings.items()}
    added_counts = {k: v - counts[k] for k, v in runner.work_counts().items()}
    return rows, added_timings, added_counts, peak_resident_bytes()


def _spec(policy, plan: PathPlan) -> _WorkerSpec:
    builtin = set(BUILTIN)
    return _WorkerSpec(
        policy=policy,
        # One spec per factory: a factory may give several implementations.
        impl_specs=tuple(dict.fromkeys(impl.spec for impl in plan.implementations if impl.name not in builtin)),
        path_globs=tuple(plan.path_globs),
        lowering=plan.lowering,
        causes=plan.causes,
        environment=environment_of_this_process(),
        parent_pid=os.getpid(),
        code_records=known_records(),
    )


class ParallelRunner:
    """`Runner`'s `run` over `jobs` spawned worker processes (see the module docstring)."""

    def __init__(self, policy, jobs: int):
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.policy = policy
        self.jobs = jobs
        self.timings = dict.fromkeys(TIMINGS, 0.0)
        self._counts: dict[str, int] = {}
        self._peak_bytes: int | None = None

    def work_counts(self) -> dict:
        """`Runner.work_counts` summed over the workers, and the largest worker's peak
        resident memory (`worker_peak_rss_mib`) once a worker has reported it."""
        peak = {} if self._peak_bytes is None else {"worker_peak_rss_mib": round(self._peak_bytes / 2**20)}
        return {**self._counts, **peak}

    def run(
        self, cases: Iterable, plan: PathPlan, *, on_case_start=None, on_step: StepCallback | None = None
    ) -> Iterator[tuple[object, list[dict]]]:
        """Yield (case, its rows) for each case in order, the work done in the workers. `on_case_start` is
        told when the parent starts waiting for a case; `on_step` gets the stages the workers relay. A
        worker's exception is raised here, as the single-process runner would raise it."""
        cases = list(cases)
        if not cases:
            return
        start_worker_server()  # if the command line did not: the server must be one that ends with this process
        context = worker_context()
        steps = context.Queue() if on_step is not None else None
        pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=min(self.jobs, len(cases)),
            mp_context=context,
            initializer=_start_worker,
            initargs=(_spec(self.policy, plan), steps),
        )
        relay = StepRelay(steps, cases, on_step) if steps is not None else contextlib.nullcontext()
        finished = False
        try:
            with relay:
                yield from self._collect(pool, cases, on_case_start)
            finished = True
        finally:
            if not finished:  # Ctrl-C, SIGTERM, an error: stop the workers now
                _terminate(pool)
            pool.shutdown(wait=True, cancel_futures=True)
            if steps is not None:
                steps.close()
                steps.cancel_join_thread()

    def _collect(self, pool, cases: list, on_case_start) -> Iterator[tuple[object, list[dict]]]:
        """`run`'s cases submitted to `pool`, costliest first (a pool takes them in that order),
        and (case, rows) yielded in the cases' order."""
        order = costliest_first(range(len(cases)), lambda index: pass_cost(cases[index]))
        submitted = {index: pool.submit(_run_case, cases[index]) for index in order}
        futures = [submitted[index] for index in range(len(cases))]
        for case, future in zip(cases, futures):
            if on_case_start is not None:
                on_case_start(case)
            try:
                rows, timings, counts, peak_bytes = future.result()
            except concurrent.futures.process.BrokenProcessPool as exc:
                raise WorkerError(f"a worker process died while running case {case.name} ({exc})") from None
            for key, seconds in timings.items():
                self.timings[key] = self.timings.get(key, 0.0) + seconds
            for key, count in counts.items():
                self._counts[key] = self._counts.get(key, 0) + count
            if peak_bytes is not None:
                self._peak_bytes = max(self._peak_bytes or 0, peak_bytes)
            yield case, rows


def _terminate(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Terminate a pool's worker processes (the executor has no public way before Python 3.14)."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()
