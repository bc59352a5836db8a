"""How long a path's compiled program takes to run on its device (the rows' timing columns).

A path runs one program, its forward pass and one VJP together
(`mhc_parity.harness.engine.paths`); that program's time is what a row records. Timing the
forward alone would need a second program per path, compiled (a Mosaic compile takes
seconds) for a figure the gate never reads, so the forward and the VJP are timed together.

Every path's program is first called once for its outputs (`first_call`: that call's time is
`execute_first_s`; it also pays for what happens once, the executable's first launch and its
buffers' first allocation, and may overlap the run's background work).

On the host CPU that run is the path's time, as it always was: the CPU figures are not speed
measurements of a kernel (a Pallas kernel there runs in interpret mode, emulated) and a warm
`make parity` must stay fast. On an accelerator the program is then timed on its own
(`device_time`), after the case's paths have all run, with the process kept quiet
(`mhc_parity.harness.engine.quiet`): `WARMUP_RUNS` waited runs, then `runs` runs issued back to
back, each waited for only once the next is issued, so the device always has the next program
queued and the host's dispatch overlaps the device's work; the elapsed time over the runs is the
device time per run. At most two runs' results exist at once (a run's outputs are dropped as
soon as it is waited for), so timing needs at most twice a run's device memory; and every run is
waited for, so the figure holds on a backend that might run two calls at once.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

from mhc_parity.harness.engine.devices import HOST_PLATFORM

# Waited runs before the timed ones: the first call already paid for what happens once; these
# settle the allocator and caches and give the run count its estimate of one run's time.
WARMUP_RUNS = 2
# The timed runs: enough of them to last about `TARGET_TIMED_S` (a millisecond program's
# dispatch jitter averages out), at least `MIN_RUNS` (a slow program is still timed more than
# once), at most `MAX_RUNS` (a microsecond program is not run forever).
TARGET_TIMED_S = 0.2
MIN_RUNS, MAX_RUNS = 5, 200


@dataclasses.dataclass(frozen=True)
class ExecutionTiming:
    """A program's time on its device, in seconds.

    first_s: the first call (dispatch and wait). run_s: the device time per run, from `runs`
    runs timed alone back to back (`device_time`), or the first call where it ran once (the
    host CPU). runs: how many runs `run_s` is taken from.
    """

    first_s: float
    run_s: float
    runs: int


def times_alone(platform: str) -> bool:
    """Whether a program on a device of `platform` is timed on its own after its first call
    (on an accelerator; not on the host CPU, where the first call is its time)."""
    return platform != HOST_PLATFORM


def first_call(
    call: Callable[[], object], keep: Callable[[object], object], *, clock: Callable[[], float] = time.perf_counter
) -> tuple[object, float]:
    """(keep(results), seconds) of one `call`, which runs the program and waits for its results.

    keep: what is kept of the results (e.g. copied to the host), taken after the call is
    timed; the results themselves are dropped on return.
    """
    start = clock()
    result = call()
    seconds = clock() - start
    return keep(result), seconds


def timed_runs(warm_s: float) -> int:
    """How many back-to-back runs time a program whose warm run took `warm_s` seconds."""
    if not warm_s > 0 or not math.isfinite(warm_s):
        return MAX_RUNS
    return max(MIN_RUNS, min(MAX_RUNS, math.ceil(TARGET_TIMED_S / warm_s)))


def device_time(
    dispatch: Callable[[], object],
    wait: Callable[[object], object],
    *,
    clock: Callable[[], float] = time.perf_counter,
    runs: int | None = None,
) -> tuple[float, int]:
    """(seconds per run, runs) of a program on its device, timed back to back (module docstring).

    dispatch: issues one run and returns its results without waiting (JAX dispatches
    asynchronously). wait: waits for a run's results (`jax.block_until_ready`). runs: the timed
    runs (default: `timed_runs` of the slowest warm-up run). Call it with the process quiet
    (`mhc_parity.harness.engine.quiet.QUIET.alone`): what runs beside it is timed with it.
    """
    warm = []
    for _ in range(WARMUP_RUNS):
        start = clock()
        wait(dispatch())
        warm.append(clock() - start)
    runs = timed_runs(max(warm)) if runs is None else runs
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    start = clock()
    previous = dispatch()
    for _ in range(runs - 1):
        current = dispatch()  # queued behind `previous` before the host waits for it
        wait(previous)
        previous = current
    wait(previous)
    del previous
    return (clock() - start) / runs, runs
