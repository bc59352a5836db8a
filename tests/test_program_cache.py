"""The compiled-program cache keeps a bounded number of programs, least recently used out.

Unbounded, a long run kept every XLA executable alive and a one-process kill matrix over
the full suite ran out of memory mappings (mhc_parity/harness/engine/program_cache.py MAX_CACHED_PROGRAMS).
"""

from __future__ import annotations

import gc
import json
import time
import weakref

import jax
import jax.numpy as jnp
import pytest

from mhc_parity.harness.engine.program_cache import MAX_CACHED_PROGRAMS, ProgramCache
from mhc_parity.records.schema import TIMING_COLUMNS


def _tiny_program(offset: float):
    return jax.jit(lambda x: x + offset).lower(jnp.float32(0)).compile()


def test_the_least_recently_used_program_is_dropped_beyond_the_bound():
    cache = ProgramCache(max_programs=2)
    cache.remember(("a",), "program a")
    cache.remember(("b",), "program b")
    assert cache.lookup(("a",)) == "program a"  # a is now the most recently used
    cache.remember(("c",), "program c")
    assert len(cache) == 2
    assert cache.lookup(("b",)) is None
    assert cache.lookup(("a",)) == "program a" and cache.lookup(("c",)) == "program c"


def test_an_evicted_program_is_released():
    cache = ProgramCache(max_programs=1)
    first = _tiny_program(1.0)
    released = weakref.ref(first)
    cache.remember(("first",), first)
    del first
    cache.remember(("second",), _tiny_program(2.0))
    gc.collect()
    assert released() is None, "the cache still holds the evicted executable"
    assert float(cache.lookup(("second",))(jnp.float32(1))) == 3.0


def test_the_default_bound_and_a_bad_bound():
    assert ProgramCache().max_programs == MAX_CACHED_PROGRAMS
    with pytest.raises(ValueError, match="at least 1"):
        ProgramCache(max_programs=0)


def test_prepared_programs_run_as_if_compiled_on_first_use_and_report_their_compile_time():
    """`prepare` compiles a case's programs concurrently; each `run` then reports the time
    its program took and computes what a program compiled on first use computes. A path
    that cannot run is left for `run` to report."""
    from mhc_parity.cases.fixtures import make_fixture
    from mhc_parity.cases.spec import Case
    from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
    from mhc_parity.harness.engine.paths import Path

    case = Case(name="prepare-small", batch=1, sequence=16, streams=2, embedding=128, branch="tanh")
    fixture = make_fixture(case)
    paths = [Path(REFERENCE), Path(INTERPRET), Path(REFERENCE, mesh=(2, 4))]  # batch 1 does not split 2 ways
    prepared = ProgramCache()
    prepared.prepare(paths, case, fixture)
    assert len(prepared) == 2
    on_first_use = ProgramCache()
    for path in paths[:2]:
        outputs, expected = prepared.run(path, case, fixture), on_first_use.run(path, case, fixture)
        assert outputs.compile_s > 0
        for name, value in expected.leaves.items():
            assert (outputs.leaves[name] == value).all(), (path.name, name)
        assert prepared.run(path, case, fixture).compile_s == 0.0  # reported once
    with pytest.raises(ValueError, match="not divisible"):
        prepared.run(paths[2], case, fixture)


def test_a_program_that_fails_to_build_ahead_raises_its_error_from_run_without_building_again(monkeypatch):
    """The error of a program obtained ahead reaches `run` as it was raised in the pool
    thread; the program is not traced a second time to meet it again."""
    import mhc_parity.harness.engine.paths as paths
    from mhc_parity.cases.fixtures import make_fixture
    from mhc_parity.cases.spec import Case
    from mhc_parity.harness.engine.implementations import REFERENCE

    case = Case(name="prepare-fails", batch=1, sequence=16, streams=2, embedding=128)
    builds = []

    def failing_build(*args):
        builds.append(args)
        raise RuntimeError("tracing broke")

    monkeypatch.setattr(paths, "_build_program", failing_build)
    cache, fixture = ProgramCache(), make_fixture(case)
    cache.prepare([paths.Path(REFERENCE)], case, fixture)
    with pytest.raises(RuntimeError, match="tracing broke"):
        cache.run(paths.Path(REFERENCE), case, fixture)
    assert len(builds) == 1 and len(cache) == 0


# Small cases for the runner's compile-ahead: two sharing one program signature per path,
# a sharded one, and one the kernels reject (the rejection comes from a program obtained
# ahead, in a pool thread).
def _ahead_cases():
    from mhc_parity.cases.spec import Case

    return [
        Case(name="ahead-a", batch=1, sequence=16, streams=2, embedding=128, branch="tanh"),
        Case(name="ahead-b", batch=1, sequence=16, streams=2, embedding=128, branch="tanh", seed=1),
        Case(name="ahead-c", batch=2, sequence=16, streams=2, embedding=128, dtype="bfloat16", mesh=(2, 4)),
        Case(
            name="ahead-d",
            batch=1,
            sequence=16,
            streams=2,
            embedding=96,
            expect="unsupported",
            expect_reason="multiple of 128",
        ),
        Case(name="ahead-e", batch=1, sequence=16, streams=3, embedding=128),
    ]


def _ahead_plan():
    from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
    from mhc_parity.harness.engine.plan import PathPlan

    return PathPlan(implementations=(REFERENCE, INTERPRET), lowering=False)


def _reference_plan():
    """The reference paths only: where what is checked is the oracle's answers, not the
    kernels' programs, the cases' rows through the reference show it as well."""
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.plan import PathPlan

    return PathPlan(implementations=(REFERENCE,), lowering=False)


def _without_timing(rows) -> list[str]:
    """Each row as JSON without its timing columns (NaN cells compare equal as text)."""
    return [json.dumps({k: v for k, v in row.items() if k not in TIMING_COLUMNS}, sort_keys=True) for row in rows]


def test_a_run_compiling_ahead_gives_the_rows_of_one_case_at_a_time():
    """`Runner.run` starts the programs of the next cases in a thread pool before their turn
    (all of cases 0..COMPILE_AHEAD_CASES when case 0 starts); its rows equal those of
    `run_case` called case by case, rejections and sharded paths included."""
    from mhc_parity.harness.engine.cases_ahead import COMPILE_AHEAD_CASES
    from mhc_parity.harness.engine.runner import Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    cases, plan = _ahead_cases(), _ahead_plan()
    assert COMPILE_AHEAD_CASES + 1 < len(cases)  # the last case is started only later
    ahead = Runner(load_policy())
    started = []
    rows = []
    for _case, case_rows in ahead.run(
        cases, plan, on_case_start=lambda case: started.append(len(ahead.collaborators.programs))
    ):
        rows.extend(case_rows)
    # cases 0..3 have 2 + 0 (same signatures) + 4 + 2 distinct programs, none taken yet
    assert started[0] == 8
    one_at_a_time = Runner(load_policy())
    expected = [row for case in cases for row in one_at_a_time.run_case(case, plan)]
    assert _without_timing(rows) == _without_timing(expected)
    verdicts = {(row["case"], row["candidate"]): row["verdict"] for row in rows}
    assert verdicts[("ahead-d", "interpret/unsharded")] == "unsupported"
    assert verdicts[("ahead-c", "interpret/sharded(data=2,fsdp=4)")] == "pass"
    compiled = [row["compile_s"] for row in rows if row["case"] == "ahead-a" and row["comparison"] == "vs_oracle"]
    assert min(compiled) > 0  # the first use of a program reports the time it took


def test_a_run_makes_the_lowering_and_compile_rows_ahead_in_its_pool_as_one_case_at_a_time():
    """Issue 69: the kernels' lowering and compile rows, made after each case's comparisons, took 36 s
    of the chip's 124 s default run. `Runner.run` makes them in its pool threads as each case is
    started; the rows are those of `run_case` case by case. A tiny case with numbers (lowering rows)
    and a `tpu` one, which a CPU gives no numbers but compile rows (one target's, to be cheap)."""
    import threading

    from mhc_parity.cases.spec import TPU_TAG, Case
    from mhc_parity.harness.engine.implementations import REFERENCE
    from mhc_parity.harness.engine.plan import PathPlan
    from mhc_parity.harness.engine.runner import Runner
    from mhc_parity.harness.engine.tpu_targets import TARGETS
    from mhc_parity.harness.judging.policy_file import load_policy

    cases = [
        Case(name="kernels-a", batch=1, sequence=16, streams=2, embedding=128, branch="tanh"),
        Case(name="kernels-b", batch=1, sequence=16, streams=2, embedding=128, tags=(TPU_TAG,)),
    ]
    plan = PathPlan((REFERENCE,), path_globs=("reference/*", "lowering/*", f"compile/{TARGETS[0].name}/*"))
    ahead, threads = Runner(load_policy()), []
    for name in ("lowering_rows", "compile_rows"):
        made = getattr(ahead, name)

        def spied(case, plan, made=made):
            threads.append(threading.current_thread().name)
            return made(case, plan)

        setattr(ahead, name, spied)
    rows = [row for _, case_rows in ahead.run(cases, plan) for row in case_rows]
    one_at_a_time = Runner(load_policy())
    expected = [row for case in cases for row in one_at_a_time.run_case(case, plan)]
    assert _without_timing(rows) == _without_timing(expected)
    made = {(row["case"], row["comparison"], row["verdict"]) for row in rows}
    wanted = {("kernels-a", "lowering", "pass"), ("kernels-b", "lowering", "pass"), ("kernels-b", "compile", "pass")}
    assert wanted <= made
    assert len(threads) == 4 and all(name.startswith("compile-ahead") for name in threads)


def test_a_run_gets_oracle_answers_ahead_in_its_pool_and_reports_their_errors_as_one_case_at_a_time():
    """`Runner.run` computes each case's oracle answer in a pool thread, once; an answer that
    raised is reported by the case's rows exactly as `run_case` reports it. The reference paths
    only (`_reference_plan`): every case still asks the oracle once, and the interpret paths'
    compiles ahead are `test_a_run_compiling_ahead_gives_the_rows_of_one_case_at_a_time`'s."""
    import threading

    from mhc_parity.harness.engine.collaborators import Collaborators, OracleFunction
    from mhc_parity.harness.engine.oracle_cache import OracleCache
    from mhc_parity.harness.engine.runner import Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    cases, plan = _ahead_cases(), _reference_plan()
    calls, lock = [], threading.Lock()

    def make_oracle():
        cache = OracleCache()

        def oracle(case, fixture):
            with lock:
                calls.append((case.name, threading.current_thread().name))
            if case.name == "ahead-b":
                raise RuntimeError("the oracle broke")
            return cache(case, fixture)

        return oracle

    ahead = Runner(load_policy(), Collaborators(oracle=OracleFunction(make_oracle())))
    rows = [row for _, case_rows in ahead.run(cases, plan) for row in case_rows]
    assert sorted(name for name, _ in calls) == sorted(case.name for case in cases)
    assert all(thread.startswith("compile-ahead") for _, thread in calls)
    calls.clear()
    one_at_a_time = Runner(load_policy(), Collaborators(oracle=OracleFunction(make_oracle())))
    expected = [row for case in cases for row in one_at_a_time.run_case(case, plan)]
    assert all(thread == threading.main_thread().name for _, thread in calls)
    assert _without_timing(rows) == _without_timing(expected)
    broken = {row["verdict"] for row in rows if row["case"] == "ahead-b"}
    assert broken == {"error"} and any("the oracle broke" in row["reason"] for row in rows)


def test_a_run_left_early_stops_its_compile_threads():
    """Leaving `Runner.run` after one case cancels what was not started and keeps the
    finished programs (nothing stays pending, no compile thread lives on). The reference paths
    only (`_reference_plan`): the later cases' programs are still compiled ahead in the pool,
    as many threads as with the kernels' (whose compiles only take longer)."""
    import threading

    from mhc_parity.harness.engine.runner import Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    runner = Runner(load_policy())
    run = runner.run(_ahead_cases(), _reference_plan())
    next(run)
    while not all(
        f.done() for f in list(runner.collaborators.programs._pending.values())
    ):  # the compiles started so far
        time.sleep(0.05)
    run.close()
    assert not runner.collaborators.programs._pending
    for thread in [t for t in threading.enumerate() if t.name.startswith("compile-ahead")]:
        thread.join(timeout=60)  # idle: each ends as soon as it sees the pool shut down
        assert not thread.is_alive()
    assert len(runner.collaborators.programs) >= 2


def test_a_run_stopped_early_does_not_wait_for_a_stuck_compile(monkeypatch):
    """A thread stuck in the code under test (here: a compile that never returns) does not
    hold up a run that is stopping: it gets `STOP_GRACE_S`, then the run goes. The reference
    paths only (`_reference_plan`): the later cases' compiles are stuck whatever they compile."""
    import threading

    from mhc_parity.harness.engine import cases_ahead
    from mhc_parity.harness.engine.runner import Runner
    from mhc_parity.harness.judging.policy_file import load_policy

    monkeypatch.setattr(cases_ahead, "STOP_GRACE_S", 0.2)
    runner = Runner(load_policy())
    cases = _ahead_cases()
    stuck = threading.Event()
    obtain = runner.collaborators.programs._obtain

    def stuck_after_the_first_case(path, case, *rest):
        if case.name == cases[0].name:
            return obtain(path, case, *rest)
        stuck.wait(120)
        raise RuntimeError("a compile that was stuck")

    monkeypatch.setattr(runner.collaborators.programs, "_obtain", stuck_after_the_first_case)
    run = runner.run(cases, _reference_plan())
    next(run)  # the first case ran; the later cases' compiles are stuck
    start = time.perf_counter()
    run.close()
    assert time.perf_counter() - start < 30
    stuck.set()
