"""A path's execution time: on an accelerator its device time, runs back to back with the
process quiet; on the CPU its one call.

mhc_parity/harness/engine/execution_timing.py, program_cache.py and path_results.py; the accelerator
is simulated (no TPU needed): the placement's platform is patched, and a fake clock advances by
the time each program run is said to take, so the recorded figures are known exactly.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from mhc_parity.harness.engine import program_cache
from mhc_parity.harness.engine.cases_ahead import CaseAhead
from mhc_parity.harness.engine.devices import HOST_PLATFORM, Placement
from mhc_parity.harness.engine.execution_timing import (
    MAX_RUNS,
    MIN_RUNS,
    TARGET_TIMED_S,
    WARMUP_RUNS,
    device_time,
    first_call,
    timed_runs,
    times_alone,
)
from mhc_parity.records.schema import TIMING_COLUMNS
from tests.support import background_under_way


class FakeDevice:
    """A device that runs one program at a time, in the order issued, each run taking
    `duration` seconds of its clock; the host's dispatch takes no time. `wait` advances the
    clock to the run's end; `in_flight` is the most runs issued and not yet waited for."""

    def __init__(self, duration: float):
        self.duration, self.now, self.busy_until = duration, 0.0, 0.0
        self.issued, self.waiting, self.in_flight = 0, set(), 0

    def clock(self) -> float:
        return self.now

    def dispatch(self) -> int:
        self.busy_until = max(self.busy_until, self.now) + self.duration
        self.issued += 1
        self.waiting.add(self.issued)
        self.in_flight = max(self.in_flight, len(self.waiting))
        return self.issued, self.busy_until

    def wait(self, run) -> None:
        number, done = run
        self.now = max(self.now, done)
        self.waiting.discard(number)


def test_the_device_time_is_the_back_to_back_runs_time_over_their_count():
    device = FakeDevice(0.004)
    seconds, runs = device_time(device.dispatch, device.wait, clock=device.clock, runs=10)
    assert runs == 10 and device.issued == WARMUP_RUNS + 10
    assert seconds == pytest.approx(0.004)  # the device never idles: the next run is always queued
    assert device.in_flight == 2  # at most two runs' results exist at once
    assert not device.waiting  # every run was waited for


def test_the_runs_last_about_the_target_time_within_their_bounds():
    assert timed_runs(0.001) == round(TARGET_TIMED_S / 0.001)
    assert timed_runs(10.0) == MIN_RUNS and timed_runs(1e-9) == MAX_RUNS
    assert timed_runs(float("nan")) == MAX_RUNS
    device = FakeDevice(0.02)
    _, runs = device_time(device.dispatch, device.wait, clock=device.clock)
    assert runs == 10  # 0.2 s of 0.02 s runs, from the warm-up's estimate
    with pytest.raises(ValueError, match="at least 1"):
        device_time(device.dispatch, device.wait, runs=0)


def test_a_first_call_is_timed_and_its_results_kept():
    device = FakeDevice(0.5)
    kept, seconds = first_call(lambda: device.wait(device.dispatch()) or "result", str.upper, clock=device.clock)
    assert kept == "RESULT" and seconds == pytest.approx(0.5)


def test_the_host_cpu_runs_once_and_an_accelerator_is_timed_alone():
    assert not times_alone(HOST_PLATFORM)
    assert times_alone("tpu") and times_alone("gpu")


@pytest.fixture(scope="module")
def tiny():
    from mhc_parity.cases.fixtures import make_fixture
    from mhc_parity.cases.spec import Case
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.paths import Path

    case = Case(name="timing-small", batch=1, sequence=16, streams=2, embedding=128, branch="tanh")
    return Path(REFERENCE), case, make_fixture(case), program_cache.ProgramCache()


def test_a_path_runs_its_program_once_and_records_its_bytes(monkeypatch, tiny):
    path, case, fixture, cache = tiny
    calls = []
    real = program_cache.first_call

    def counted(call, keep):
        calls.append(1)
        return real(call, keep, clock=itertools.count(0.0, 0.25).__next__)

    monkeypatch.setattr(program_cache, "first_call", counted)
    outputs = cache.run(path, case, fixture)
    assert len(calls) == 1
    assert outputs.execute_s == outputs.execute_first_s == pytest.approx(0.25) and outputs.execute_runs == 1
    # the arguments (x, cotangent, weights, branch parameters) and results (forward and gradient
    # leaves) of the program, from the arrays themselves
    arguments = [fixture.x, fixture.cotangent, *fixture.weights.values(), *fixture.branch_params.values()]
    expected = sum(a.nbytes for a in arguments) + sum(v.nbytes for v in outputs.leaves.values())
    assert outputs.bytes_moved == expected
    cells = dict(zip(TIMING_COLUMNS, outputs.timing, strict=True))
    assert cells["bytes_moved"] == expected and cells["execute_runs"] == 1


def test_a_path_on_an_accelerator_records_its_device_time(monkeypatch, tiny):
    """The runner replaces an accelerator path's first-call time by `ProgramCache.device_time`'s."""
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.runner import PathPlan, Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    _, case, fixture, _ = tiny
    monkeypatch.setattr(Placement, "platform", property(lambda self: "tpu"))
    runner = Runner(load_policy())
    monkeypatch.setattr(runner.collaborators.programs, "device_time", lambda path, case, fixture: (0.003, 17))
    rows = list(runner.run_case(case, PathPlan(implementations=(REFERENCE,), lowering=False), ahead=CaseAhead(fixture)))
    timed = [row for row in rows if row["comparison"] == "vs_oracle"]
    assert timed and all(row["execute_s"] == 0.003 and row["execute_runs"] == 17 for row in timed)
    assert all(row["execute_first_s"] > 0 and row["bytes_moved"] > 0 for row in timed)


def test_a_path_on_the_cpu_is_not_timed_again(monkeypatch, tiny):
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.runner import PathPlan, Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    _, case, fixture, _ = tiny
    runner = Runner(load_policy())
    monkeypatch.setattr(runner.collaborators.programs, "device_time", lambda *a: pytest.fail("timed again on the CPU"))
    rows = list(runner.run_case(case, PathPlan(implementations=(REFERENCE,), lowering=False), ahead=CaseAhead(fixture)))
    timed = [row for row in rows if row["comparison"] == "vs_oracle"]
    assert timed and all(row["execute_s"] == row["execute_first_s"] and row["execute_runs"] == 1 for row in timed)


def test_the_real_device_time_of_a_program_runs_it_back_to_back(tiny):
    path, case, fixture, cache = tiny
    cache.run(path, case, fixture)
    seconds, runs = cache.device_time(path, case, fixture)
    assert MIN_RUNS <= runs <= MAX_RUNS and seconds > 0


def test_no_background_work_runs_while_a_path_is_timed(monkeypatch):
    """Issue 55: a run timed an accelerator path's repeats while its pool computed the next
    cases' oracle answers (and compiled their programs), and timed them too. Here the second
    case's oracle takes a second in the pool while the first case's paths run: no timed run
    of any path (each call of its program after the first) may overlap it."""
    from mhc_parity.cases.spec import Case
    from mhc_parity.harness.engine.collaborators import Collaborators, OracleFunction
    from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
    from mhc_parity.harness.engine.oracle_cache import OracleCache
    from mhc_parity.harness.engine.runner import PathPlan, Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    cases = [
        Case(name="quiet-a", batch=1, sequence=16, streams=2, embedding=128, branch="tanh"),
        Case(name="quiet-b", batch=1, sequence=16, streams=2, embedding=128, branch="identity"),
    ]
    monkeypatch.setattr(Placement, "platform", property(lambda self: "tpu"))
    lock, oracle_spans, program_calls = threading.Lock(), [], {}
    answers = OracleCache()

    def slow_oracle(case, fixture):
        start = time.perf_counter()
        answer = answers(case, fixture)
        if case.name == "quiet-b":
            time.sleep(1.0)
        with lock:
            oracle_spans.append((start, time.perf_counter()))
        return answer

    runner = Runner(load_policy(), Collaborators(oracle=OracleFunction(slow_oracle)))
    obtain = runner.collaborators.programs._obtain

    def spied(path, case, *rest):
        compiled = obtain(path, case, *rest)

        def program(*args):
            with lock:
                program_calls.setdefault((case.name, path.name), []).append(time.perf_counter())
            return compiled(*args)

        return program

    monkeypatch.setattr(runner.collaborators.programs, "_obtain", spied)
    plan = PathPlan(implementations=(REFERENCE, INTERPRET), lowering=False)
    rows = [row for _, case_rows in runner.run(cases, plan) for row in case_rows]
    assert {row["verdict"] for row in rows} == {"pass"}
    timed_calls = [t for calls in program_calls.values() for t in calls[1:]]
    assert timed_calls, "no path was timed"
    inside = [t for t in timed_calls for start, end in oracle_spans if start < t < end]
    assert not inside, f"{len(inside)} timed runs overlapped an oracle answer computed beside them"
    assert all(row["execute_runs"] > 1 for row in rows if row["comparison"] == "vs_oracle")


def test_a_stuck_background_task_leaves_the_paths_untimed_not_hung(monkeypatch, tiny):
    """A background task that does not end within the wait (stuck in the code under test)
    does not hang the run: the paths keep their first call's time, one run."""
    from mhc_parity.harness.engine import path_results
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.quiet import QUIET
    from mhc_parity.harness.engine.runner import PathPlan, Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    _, case, fixture, _ = tiny
    monkeypatch.setattr(Placement, "platform", property(lambda self: "tpu"))
    monkeypatch.setattr(path_results, "QUIET_WAIT_S", 0.2)
    with background_under_way(QUIET):  # stuck until the run is done
        rows = list(
            Runner(load_policy()).run_case(
                case, PathPlan(implementations=(REFERENCE,), lowering=False), ahead=CaseAhead(fixture)
            )
        )
    timed = [row for row in rows if row["comparison"] == "vs_oracle"]
    assert timed and all(row["execute_runs"] == 1 for row in timed)
    with QUIET.alone(1.0) as quiet:  # the lock is free again
        assert quiet


def test_cases_whose_paths_ran_while_the_pool_was_busy_are_timed_together(monkeypatch):
    """Issue 69: each timing waited for the pool's work under way (the next cases' compiles), case by
    case. While the pool is busy, the cases whose paths ran wait to be timed at once (at most
    `TIMED_TOGETHER`, the last case at once): fewer quiet phases than cases, no timed run beside
    background work, and the rows, less their timing columns, those of the cases run one by one."""
    from mhc_parity.cases.spec import Case
    from mhc_parity.harness.engine import cases_ahead
    from mhc_parity.harness.engine.collaborators import Collaborators, OracleFunction
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.oracle_cache import OracleCache
    from mhc_parity.harness.engine.runner import PathPlan, Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    cases = [
        Case(name=f"together-{i}", batch=1, sequence=16, streams=2, embedding=128, branch="tanh") for i in range(6)
    ]
    monkeypatch.setattr(Placement, "platform", property(lambda self: "tpu"))
    answers, lock, oracle_spans = OracleCache(), threading.Lock(), []

    def slow_oracle(case, fixture):  # keeps the pool busy while the earlier cases run
        start = time.perf_counter()
        answer = answers(case, fixture)
        time.sleep(0.3)
        with lock:
            oracle_spans.append((start, time.perf_counter()))
        return answer

    runner = Runner(load_policy(), Collaborators(oracle=OracleFunction(slow_oracle)))
    batches, timed_at = [], []
    time_points = runner.time_points
    device_time = runner.collaborators.programs.device_time

    def spied_points(points):
        batches.append([point.case.name for point in points])
        return time_points(points)

    def spied_device_time(*args):
        timed_at.append(time.perf_counter())
        return device_time(*args)

    monkeypatch.setattr(runner, "time_points", spied_points)
    monkeypatch.setattr(runner.collaborators.programs, "device_time", spied_device_time)
    plan = PathPlan(implementations=(REFERENCE,), lowering=False)
    together = [(case.name, rows) for case, rows in runner.run(cases, plan)]

    assert [name for name, _ in together] == [case.name for case in cases]
    assert [name for batch in batches for name in batch] == [case.name for case in cases]
    assert len(batches) < len(cases) and max(map(len, batches)) <= cases_ahead.TIMED_TOGETHER
    assert timed_at and not [t for t in timed_at for start, end in oracle_spans if start < t < end]
    one_by_one = Runner(load_policy(), Collaborators(oracle=OracleFunction(answers)))

    def untimed(rows):
        return [{k: repr(v) for k, v in row.items() if k not in TIMING_COLUMNS} for row in rows]  # NaN == NaN

    for case, (name, rows) in zip(cases, together):
        assert untimed(rows) == untimed(one_by_one.run_case(case, plan)), name
        assert all(row["execute_runs"] > 1 for row in rows if row["comparison"] == "vs_oracle")


def test_a_case_holding_more_than_the_bytes_allowed_is_timed_at_once(monkeypatch):
    """The cases waiting to be timed hold their leaves: past `TIMED_TOGETHER_BYTES` (a `tpu`-suite
    case's size) each is timed as soon as its paths ran, however busy the pool."""
    from mhc_parity.cases.spec import Case
    from mhc_parity.harness.engine import cases_ahead
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.quiet import QuietLock
    from mhc_parity.harness.engine.runner import PathPlan, Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    cases = [Case(name=f"held-{i}", batch=1, sequence=16, streams=2, embedding=128, branch="tanh") for i in range(3)]
    monkeypatch.setattr(Placement, "platform", property(lambda self: "tpu"))
    monkeypatch.setattr(QuietLock, "busy", property(lambda self: True))  # the pool is never idle
    plan = PathPlan(implementations=(REFERENCE,), lowering=False)

    def batches(limit: int) -> list[int]:
        monkeypatch.setattr(cases_ahead, "TIMED_TOGETHER_BYTES", limit)
        runner, sizes = Runner(load_policy()), []
        time_points = runner.time_points
        monkeypatch.setattr(runner, "time_points", lambda points: sizes.append(len(points)) or time_points(points))
        list(runner.run(cases, plan))
        return sizes

    assert batches(2**30) == [3]
    assert batches(1) == [1, 1, 1]
