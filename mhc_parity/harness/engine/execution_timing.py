"""How long a path's compiled program (its forward and VJP, one program) takes on its device: the rows'
timing columns. `first_call` is the call whose outputs are judged; on the host CPU its time is the
path's (no kernel speed measurement there). On an accelerator `device_time` then times the program
alone, runs issued back to back with the next always queued, at most two runs' results alive."""

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
    """A program's time on its device, in seconds: first_s the first call (dispatch and wait); run_s the
    device time per run over `runs` runs timed back to back (`device_time`), or the first call where it
    ran once (the host CPU)."""

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
    """(keep(results), seconds) of one `call`, which runs the program and waits for its results; `keep`
    (e.g. a copy to the host) is taken after the timing, and the results are dropped on return."""
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
    """(seconds per run, runs) of a program on its device, its runs issued back to back. `dispatch` issues
    one run without waiting; `wait` waits for a run's results; `runs` defaults to `timed_runs` of the
    slowest warm-up run. Call it with the process quiet (`QUIET.alone`): what runs beside it is timed too."""
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
