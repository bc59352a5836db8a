"""How long a path's compiled program takes to run on its device (the rows' timing columns).

A path runs one program, its forward pass and one VJP together
(`mhc_parity.harness.engine.paths`); that program's time is what a row records. Timing the
forward alone would need a second program per path, compiled (a Mosaic compile takes
seconds) for a figure the gate never reads, so the forward and the VJP are timed together.

On the host CPU the program runs once, as it always did, and that run is its time: the CPU
figures are not speed measurements of a kernel (a Pallas kernel there runs in interpret
mode, emulated) and a warm `make parity` must stay fast. On an accelerator the first call
also pays for what happens once (the executable's first launch, its buffers' first
allocation), so the program runs `ACCELERATOR_REPEATS` more times and the median of those
is its time; the first call's is kept beside it.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from mhc_parity.harness.engine.devices import HOST_PLATFORM

# Runs after the first whose median is an accelerator path's time. The mHC programs take
# milliseconds on a chip against seconds to compile, so five more runs add little to a
# run; a median of five ignores two slow outliers (a host interruption, a dispatch that
# waited), and an odd count makes it one measured run, not an average of two.
ACCELERATOR_REPEATS = 5


@dataclasses.dataclass(frozen=True)
class ExecutionTiming:
    """A program's time on its device, in seconds.

    first_s: the first call. median_s: the median of the runs after it, or the first call
    where it ran once (the host CPU). runs: how many runs `median_s` is taken from.
    """

    first_s: float
    median_s: float
    runs: int


def repeats_for(platform: str) -> int:
    """Runs after the first that time a program on a device of `platform` (0 on the host CPU)."""
    return 0 if platform == HOST_PLATFORM else ACCELERATOR_REPEATS


def timed_execution(
    call: Callable[[], object],
    keep: Callable[[object], object],
    *,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[object, ExecutionTiming]:
    """(keep(first result), its timing): `call` once, then `repeats` times more.

    call: runs the program and blocks until its results are ready. keep: what is kept of
    the first call's results (e.g. copied to the host), taken before the repeats, whose
    results are dropped as they come, so a repeat needs no more device memory than the
    first call did.
    """
    if repeats < 0:
        raise ValueError(f"repeats must be at least 0, got {repeats}")
    start = clock()
    result = call()
    first_s = clock() - start
    kept = keep(result)
    del result
    times = []
    for _ in range(repeats):
        start = clock()
        call()
        times.append(clock() - start)
    if not times:
        return kept, ExecutionTiming(first_s, first_s, 1)
    return kept, ExecutionTiming(first_s, statistics.median(times), len(times))
