"""The float64 oracle of a large (`tpu`-tagged) case in a child process of its own
(`python -m mhc_parity.harness.engine.oracle_process`, `JAX_PLATFORMS=cpu`), which writes the oracle
cache's entry with its peak resident memory, what `case_memory`'s budget estimates (the rows'
`oracle_peak_bytes`). The child loads no foreign code, so its answer is the project's own, computed at
the parent's draws' units bit for bit as the run would. Children run side by side only while their
budgets fit the memory (`_Admission`); where one fails, the run computes the answer itself."""

from __future__ import annotations

import collections
import json
import logging
import os
import pathlib
import pickle
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.spec import TPU_TAG
from mhc_parity.harness.engine.case_memory import chunk_working_bytes, memory_for_a_case, oracle_memory_bytes
from mhc_parity.harness.engine.oracle_cache import deserialize, own_material, serialize
from mhc_parity.harness.engine.oracle_path import OracleOutputs, oracle_units, run_oracle_path
from mhc_parity.harness.engine.run_info import enable_compilation_cache
from mhc_parity.harness.env import ensure_host_devices
from mhc_parity.harness.processes.worker_processes import available_memory_bytes, end_with_parent
from mhc_parity.mhc.oracle_chunks import chunk_count
from mhc_parity.records.files import atomic_write
from mhc_parity.records.project_code import PROJECT_ROOT
from mhc_parity.records.settings import setting

# "always" / "never" override the tag (tests; a machine where a child cannot start).
OWN_PROCESS_ENV_VAR = "MHC_PARITY_ORACLE_PROCESS"
# The share of the memory available when the first child started that children may hold together.
ADMITTED_FRACTION = 0.85
# glibc keeps the memory it frees (one arena, nothing mapped apart, nothing trimmed), so each chunk
# reuses the last one's pages instead of faulting in and zeroing gigabytes afresh (docs/judging.md:
# 2.4x faster on the lent TPU VM, 1.7x on a 2-core CPU). A MALLOC_* or GLIBC_TUNABLES of the parent's wins.
KEEP_FREED_MEMORY = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
# A child runs one token chunk at a time unless this variable states more (a positive integer), each on
# a thread of its own; two at once ran 10% faster on the TPU VM for twice the memory (docs/judging.md).
# `room_for_a_chunk` keeps it to the memory.
IN_FLIGHT_ENV_VAR = "MHC_PARITY_ORACLE_CHUNKS_IN_FLIGHT"

log = logging.getLogger(__name__)


def own_process(case) -> bool:
    """Whether `case`'s oracle is computed in a process of its own (module docstring)."""
    told = setting(OWN_PROCESS_ENV_VAR)
    return TPU_TAG in case.all_tags if told is None else told == "always"


class _Admission:
    """First come, first admitted: a child starts when it is first in line and the budgets of
    the children running and its own fit `capacity` (taken when the first asks), or none runs."""

    def __init__(self):
        self._condition = threading.Condition()
        self._line: collections.deque = collections.deque()
        self._held = 0
        self._running = 0
        self.capacity: int | None = None

    def acquire(self, need: int) -> None:
        with self._condition:
            if self.capacity is None:
                available = memory_for_a_case()
                self.capacity = None if available is None else int(ADMITTED_FRACTION * available)
            ticket = object()
            self._line.append(ticket)
            while self._line[0] is not ticket or (
                self._running and self.capacity is not None and self._held + need > self.capacity
            ):
                self._condition.wait()
            self._line.popleft()
            self._held += need
            self._running += 1
            self._condition.notify_all()

    def release(self, need: int) -> None:
        with self._condition:
            self._held -= need
            self._running -= 1
            self._condition.notify_all()


ADMISSION = _Admission()


def child_environment() -> dict[str, str]:
    """The parent's environment, the CPU its only JAX platform, this project first on the path,
    glibc keeping the memory it frees (`KEEP_FREED_MEMORY`) unless the parent sets glibc's own."""
    own_glibc = any(name.startswith("MALLOC_") or name == "GLIBC_TUNABLES" for name in os.environ)
    environment = dict(os.environ) if own_glibc else {**KEEP_FREED_MEMORY, **os.environ}
    environment["JAX_PLATFORMS"] = "cpu"
    path = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + path if path else "")
    return environment


def chunks_in_flight(case, chunk_tokens: int) -> int:
    """How many of `case`'s oracle chunks (of `chunk_tokens` tokens) its own process runs at once:
    `$MHC_PARITY_ORACLE_CHUNKS_IN_FLIGHT` where set (at most the chunks), else one. The answer is
    the same bits whatever the count (`mhc_parity.mhc.oracle_chunks`)."""
    count = setting(IN_FLIGHT_ENV_VAR)
    return 1 if count is None else min(count, chunk_count(case.shape[0] * case.shape[1], chunk_tokens))


def room_for_a_chunk(working_bytes: int) -> Callable[[], bool]:
    """Whether another chunk of `working_bytes` may start beside those running: while the memory available
    now holds twice its working set, as the machine's use moves (the lent TPU VM counted memory its
    processes had freed as in use for a while)."""

    def room() -> bool:
        available = available_memory_bytes()
        return available is None or available >= 2 * working_bytes

    return room


def compute_in_own_process(case, key: dict, units, entry: pathlib.Path) -> int:
    """Compute `case`'s oracle answer in a child process that writes it to the cache entry `entry` under
    `key`, at the draws' `units` (`OracleUnits`), `chunks_in_flight` chunks at once; returns the child's
    peak resident memory in bytes. MemoryError where the child was killed (the out-of-memory killer's
    SIGKILL); RuntimeError with its last words where it failed otherwise."""
    in_flight = chunks_in_flight(case, key["chunk_tokens"])
    budget = oracle_memory_bytes(case, key["chunk_tokens"], in_flight)
    request = {"case": case, "key": key, "units": units, "entry": str(entry), "in_flight": in_flight, "budget": budget}
    ADMISSION.acquire(budget)
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__],
            input=pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL),
            capture_output=True,
            env=child_environment(),
            check=False,
        )
    finally:
        ADMISSION.release(budget)
    words = done.stderr.decode(errors="replace").strip().splitlines()
    if done.returncode < 0 or done.returncode == 137:
        raise MemoryError(
            f"the oracle's own process for case {case.name} was killed (exit {done.returncode}), as the "
            f"system does when memory runs out; its budget is {budget / 2**30:.1f} GiB"
        )
    if done.returncode != 0:
        raise RuntimeError(
            f"the oracle's own process for case {case.name} failed (exit {done.returncode}): "
            + (" | ".join(words[-3:]) or "no message")
        )
    return int(json.loads(done.stdout.decode().strip().splitlines()[-1])["peak_bytes"])


def compute_apart(case, key: dict, entry: pathlib.Path, here: Callable[[], OracleOutputs]) -> OracleOutputs | None:
    """`OracleCache`'s hook for an answer it lacks: for a case of its own process (`own_process`), the answer
    computed there into `entry` under the project's own `key` and read back; else None (the cache
    computes it). Where the child cannot run, `here()` computes it in this process, admitted against the
    memory as the child was."""
    if not own_process(case):
        return None
    try:
        peak = compute_in_own_process(case, key, oracle_units(case), entry)
    except RuntimeError as error:  # the child could not run here: the numbers matter more than its figure
        log.warning("%s; computing it in the run's process instead (no peak memory figure)", error)
        budget = oracle_memory_bytes(case, key["chunk_tokens"])
        ADMISSION.acquire(budget)
        try:
            return here()
        finally:
            ADMISSION.release(budget)
    outputs = deserialize(entry, key)
    if outputs.peak_bytes != peak:  # the entry read is the one the child wrote
        raise RuntimeError(f"case {case.name}: the oracle entry {entry} is not the one its process wrote")
    return outputs


# Where the kernel keeps no high-water mark, how often `sample_resident_peak` reads VmRSS.
RESIDENT_SAMPLE_S = 0.02
_sampled_peak = {"started": False, "bytes": 0}


def _status_bytes(field: str) -> int | None:
    """A memory field of /proc/self/status ("VmHWM", "VmRSS"; "123456 kB") in bytes, or None
    where it is missing: no procfs, or gVisor's (the lent TPU VM), which has VmRSS and no VmHWM."""
    try:
        status = pathlib.Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def sample_resident_peak() -> None:
    """Where /proc/self/status has VmRSS but no VmHWM (gVisor), read VmRSS every
    `RESIDENT_SAMPLE_S` on a thread of its own from now on, for `peak_resident_bytes`. With the
    freed memory kept (`KEEP_FREED_MEMORY`) the resident memory only grows, so no peak slips
    between two readings."""
    if _sampled_peak["started"] or _status_bytes("VmHWM") is not None or _status_bytes("VmRSS") is None:
        return

    def sample():
        while True:
            _sampled_peak["bytes"] = max(_sampled_peak["bytes"], _status_bytes("VmRSS") or 0)
            time.sleep(RESIDENT_SAMPLE_S)

    _sampled_peak["started"] = True
    threading.Thread(target=sample, name="resident-peak", daemon=True).start()


def peak_resident_bytes() -> int:
    """This process's peak resident memory so far: its address space's high-water mark
    (`VmHWM`, which starts afresh at exec); where there is none, the largest VmRSS read since
    `sample_resident_peak` (gVisor). Not `ru_maxrss` unless neither is there (no procfs: an upper
    bound): Linux carries that across the exec from the forked parent, so a child of a run
    holding gigabytes would report them."""
    high_water = _status_bytes("VmHWM")
    if high_water is not None:
        return high_water
    resident = _status_bytes("VmRSS")
    if resident is not None and _sampled_peak["started"]:
        return max(_sampled_peak["bytes"], resident)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def write_answer(case, key: dict, units, entry: pathlib.Path, in_flight: int, budget: int) -> dict:
    """The child's work: the fixture from its cache, the oracle at `units` (`in_flight` chunks at
    once, under `budget` bytes), the cache's entry written under `key`; returns the figures (this
    process's peak bytes once the oracle had run; its seconds). RuntimeError where `key` is not
    what this process computes: its fixture, or the code, versions and compiler it states
    (`oracle_cache.own_material`)."""
    fixture = make_fixture(case)
    if fixture.digest() != key["fixture"]:
        raise RuntimeError(f"case {case.name}: the fixture cache holds another fixture than the run's")
    differing = sorted(name for name, value in own_material().items() if key.get(name) != value)
    if differing:
        raise RuntimeError(
            f"case {case.name}: the oracle's own process differs from the run's in {', '.join(differing)}"
        )
    start = time.perf_counter()
    room = room_for_a_chunk(chunk_working_bytes(case, key["chunk_tokens"]))
    outputs = run_oracle_path(case, fixture, key["chunk_tokens"], units=units, in_flight=in_flight, room=room)
    seconds = time.perf_counter() - start
    # Before the entry is encoded: the oracle's peak, as the budget counts it.
    peak = peak_resident_bytes()
    atomic_write(pathlib.Path(entry), serialize(key, outputs, peak_bytes=peak, budget_bytes=budget))
    return {"peak_bytes": peak, "oracle_s": round(seconds, 3), "in_flight": in_flight}


def child_main(request: dict) -> dict:
    """The child's work (`write_answer` at the parent's units); returns its figures."""
    ensure_host_devices()  # an entry point: the flags before JAX's backend starts
    enable_compilation_cache()
    sample_resident_peak()
    return write_answer(
        request["case"], request["key"], request["units"], request["entry"], request["in_flight"], request["budget"]
    )


if __name__ == "__main__":
    # Ends with the run (a call's time limit, Ctrl-C): an oracle nobody waits for must not hold
    # gigabytes and cores beside the run that resumes it (started from a thread that waits for it).
    end_with_parent()
    print(json.dumps(child_main(pickle.loads(sys.stdin.buffer.read()))))
