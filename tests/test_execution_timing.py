"""A path's execution time: the median of repeated runs on an accelerator, one run on the CPU.

mhc_parity/harness/engine/execution_timing.py; the accelerator is simulated (no TPU needed):
the placement's platform is patched, and a fake clock advances by the time each program
call is said to take, so the recorded figures are known exactly.
"""

from __future__ import annotations

import itertools

import pytest

from mhc_parity.harness.engine import execution_timing, program_cache
from mhc_parity.harness.engine.devices import HOST_PLATFORM, Placement
from mhc_parity.harness.engine.execution_timing import (
    ACCELERATOR_REPEATS,
    ExecutionTiming,
    repeats_for,
    timed_execution,
)
from mhc_parity.records.schema import TIMING_COLUMNS


class FakeDevice:
    """A clock and a program whose n-th call takes `durations[n]` seconds of the clock."""

    def __init__(self, durations):
        self.now = 0.0
        self.durations = iter(durations)
        self.calls = 0

    def clock(self) -> float:
        return self.now

    def advance(self) -> None:
        self.calls += 1
        self.now += next(self.durations)

    def run(self):
        self.advance()
        return f"result {self.calls}"


def test_the_median_of_the_runs_after_the_first_is_the_time_and_the_first_is_kept():
    device = FakeDevice([9.0, 3.0, 1.0, 7.0, 2.0, 4.0])
    kept, timing = timed_execution(device.run, str.upper, repeats=5, clock=device.clock)
    assert device.calls == 6
    assert kept == "RESULT 1"  # the first call's results, through `keep`
    assert timing == ExecutionTiming(first_s=9.0, median_s=3.0, runs=5)  # median of 3, 1, 7, 2, 4


def test_a_single_run_is_its_own_time():
    device = FakeDevice([9.0])
    kept, timing = timed_execution(device.run, str, repeats=0, clock=device.clock)
    assert device.calls == 1 and kept == "result 1"
    assert timing == ExecutionTiming(first_s=9.0, median_s=9.0, runs=1)
    with pytest.raises(ValueError, match="at least 0"):
        timed_execution(device.run, str, repeats=-1)


def test_the_host_cpu_runs_once_and_an_accelerator_repeats():
    assert repeats_for(HOST_PLATFORM) == 0
    assert repeats_for("tpu") == repeats_for("gpu") == ACCELERATOR_REPEATS > 1


def _spy_on_program_runs(monkeypatch, durations):
    """Make `ProgramCache.run` time its program with a fake clock; returns the fake device
    (its `calls` count the program's runs) and the repeats each `run` asked for."""
    device, asked = FakeDevice(durations), []

    def timed(call, keep, *, repeats):
        asked.append(repeats)

        def counted():
            device.advance()
            return call()

        return execution_timing.timed_execution(counted, keep, repeats=repeats, clock=device.clock)

    monkeypatch.setattr(program_cache, "timed_execution", timed)
    return device, asked


@pytest.fixture(scope="module")
def tiny():
    from mhc_parity.cases.fixtures import make_fixture
    from mhc_parity.cases.spec import Case
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.paths import Path

    case = Case(name="timing-small", batch=1, sequence=16, streams=2, embedding=128, branch="tanh")
    return Path(REFERENCE), case, make_fixture(case), program_cache.ProgramCache()


def test_a_path_on_an_accelerator_records_the_median_of_repeated_runs(monkeypatch, tiny):
    path, case, fixture, cache = tiny
    single = cache.run(path, case, fixture)  # the real CPU run: the leaves to match
    monkeypatch.setattr(Placement, "platform", property(lambda self: "tpu"))
    durations = [0.5, *(0.004, 0.001, 0.003, 0.002, 0.005, 0.006, 0.007)[:ACCELERATOR_REPEATS]]
    device, asked = _spy_on_program_runs(monkeypatch, durations)
    outputs = cache.run(path, case, fixture)
    assert asked == [ACCELERATOR_REPEATS] and device.calls == 1 + ACCELERATOR_REPEATS
    repeats = sorted(durations[1:])
    assert outputs.execute_s == pytest.approx(repeats[len(repeats) // 2])
    assert outputs.execute_first_s == pytest.approx(0.5) and outputs.execute_runs == ACCELERATOR_REPEATS
    cells = dict(zip(TIMING_COLUMNS, outputs.timing, strict=True))
    assert cells["execute_s"] == outputs.execute_s and cells["execute_runs"] == ACCELERATOR_REPEATS
    for name, value in single.leaves.items():  # the leaves are the first call's, as on the CPU
        assert (outputs.leaves[name] == value).all(), name


def test_a_path_on_the_cpu_runs_its_program_once(monkeypatch, tiny):
    path, case, fixture, cache = tiny
    device, asked = _spy_on_program_runs(monkeypatch, itertools.repeat(0.25))
    outputs = cache.run(path, case, fixture)
    assert asked == [0] and device.calls == 1
    assert outputs.execute_s == outputs.execute_first_s == pytest.approx(0.25) and outputs.execute_runs == 1
