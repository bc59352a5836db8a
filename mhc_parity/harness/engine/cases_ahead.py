"""Running cases ahead (`Runner.run`): while one case runs its paths and comparisons, a thread pool
loads the next `COMPILE_AHEAD_CASES` cases' fixtures, computes their oracle answers and compiles their
programs. The rows are those of `Runner.run_case` called case by case."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from mhc_parity.harness.engine.path_results import runnable
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.program_cache import COMPILE_THREADS
from mhc_parity.harness.engine.quiet import QUIET

if TYPE_CHECKING:
    from mhc_parity.harness.engine.runner import Runner, StepCallback

# Cases ahead of the running one whose programs `Runner.run` starts compiling: enough to
# keep the compile threads busy while a case's oracle and comparisons run.
COMPILE_AHEAD_CASES = 3
# How long a run stopped early waits for the programs being compiled ahead before it drops
# them: long enough for a normal compile to land, short enough for one Ctrl-C to feel prompt.
STOP_GRACE_S = 5.0


def cases_ahead(
    runner: Runner,
    cases: Sequence,
    plan: PathPlan,
    on_case_start: Callable[[object], None] | None,
    on_step: StepCallback,
) -> Iterator[tuple[object, list[dict]]]:
    """(case, its rows) for each of `cases` in order, `runner`'s collaborators working ahead in a pool
    (its oracle must then be thread-safe, as `OracleCache` is; its programs must compile ahead)."""
    programs = runner.collaborators.programs
    started: dict[int, tuple[object, concurrent.futures.Future | None]] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix="compile-ahead")
    finished = False
    try:
        for index, case in enumerate(cases):
            for ahead in range(index, min(index + 1 + COMPILE_AHEAD_CASES, len(cases))):
                if ahead not in started:
                    started[ahead] = _start_case(runner, pool, cases[ahead], plan)
            if on_case_start is not None:
                on_case_start(case)
            fixture, oracle_ahead = started.pop(index)
            yield case, list(runner.run_case(case, plan, on_step, fixture=fixture, oracle_ahead=oracle_ahead))
        finished = True
    finally:
        # Stopped early (Ctrl-C, an error, the caller): a pool thread may be stuck in the
        # code under test, so programs being compiled get `STOP_GRACE_S`, not forever
        # (the command abandons a stuck thread: mhc_parity.harness.cli.entry).
        pool.shutdown(wait=finished, cancel_futures=True)
        programs.settle_pending(grace_s=0.0 if finished else STOP_GRACE_S)


def _start_case(runner: Runner, pool, case, plan: PathPlan) -> tuple[object, concurrent.futures.Future | None]:
    """Load `case`'s fixture and start its oracle answer, then its programs, in `pool`:
    (fixture, the answer's future), or (None, None) if loading the fixture failed
    (`run_case` then meets the error again and reports it) or the case needs no numbers
    (`PathPlan.needs_numbers`)."""
    if not plan.needs_numbers(case):
        return None, None
    try:
        fixture = runner.load_fixture(case)
    except Exception:  # noqa: BLE001 - reported by run_case
        return None, None
    # first: the case needs it before its paths; background work, which a timed path waits for
    oracle = pool.submit(QUIET.run_in_background, runner.collaborators.oracle, case, fixture)
    runner.collaborators.programs.compile_ahead(pool, runnable(plan.paths_for(case), case), case, fixture)
    return fixture, oracle
