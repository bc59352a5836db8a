"""Running cases ahead (`Runner.run`): while one case runs its paths and comparisons, a thread pool
loads the next `COMPILE_AHEAD_CASES` cases' fixtures, computes their oracle answers, compiles their
programs and makes their TPU lowering and compile rows. A program is timed on the device with nothing
else in the process running, which waits for the pool's work under way: while the pool is busy, up to
`TIMED_TOGETHER` cases whose paths ran are timed at once, so that wait is paid once for them (issue
69). The rows are those of `Runner.run_case` called case by case."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from mhc_parity.harness.engine.path_results import TimingPoint, runnable, waits_for_device
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.program_cache import COMPILE_THREADS
from mhc_parity.harness.engine.quiet import QUIET

if TYPE_CHECKING:
    from mhc_parity.harness.engine.runner import Runner, StepCallback

# Cases ahead of the running one whose programs `Runner.run` starts compiling: enough to
# keep the compile threads busy while a case's oracle and comparisons run.
COMPILE_AHEAD_CASES = 3
# Cases whose paths ran that wait to be timed together while the pool is busy, and the host bytes
# they may hold meanwhile (their paths' and the oracle's leaves): the `tpu` suite's cases are each
# timed at once. Their programs stay in the program cache (`MAX_CACHED_PROGRAMS`) until timed.
TIMED_TOGETHER = 4
TIMED_TOGETHER_BYTES = 256 * 2**20
# How long a run stopped early waits for the programs being compiled ahead before it drops
# them: long enough for a normal compile to land, short enough for one Ctrl-C to feel prompt.
STOP_GRACE_S = 5.0


@dataclasses.dataclass(frozen=True)
class CaseAhead:
    """What `cases_ahead` started for one case (`Runner.case_steps` makes the rest): its fixture, and
    the futures of its oracle answer, its lowering rows and its compile rows (`Runner.lowering_rows`,
    `Runner.compile_rows`)."""

    fixture: object = None
    oracle: concurrent.futures.Future | None = None
    lowering: concurrent.futures.Future | None = None
    compile: concurrent.futures.Future | None = None


NOTHING_AHEAD = CaseAhead()


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
    started: dict[int, CaseAhead] = {}
    waiting: list[_CaseSteps] = []  # cases in order, the last ones' paths waiting to be timed
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix="compile-ahead")
    finished = False
    try:
        for index, case in enumerate(cases):
            for ahead in range(index, min(index + 1 + COMPILE_AHEAD_CASES, len(cases))):
                if ahead not in started:
                    started[ahead] = _start_case(runner, pool, cases[ahead], plan)
            if on_case_start is not None:
                on_case_start(case)
            steps = runner.case_steps(case, plan, on_step, started.pop(index))
            waiting.append(_CaseSteps(case, steps))
            if not waiting[-1].advance() or _time_now(runner, waiting, last=index == len(cases) - 1):
                yield from _finish(runner, waiting)
        finished = True
    finally:
        # Stopped early (Ctrl-C, an error, the caller): a pool thread may be stuck in the
        # code under test, so programs being compiled get `STOP_GRACE_S`, not forever
        # (the command abandons a stuck thread: mhc_parity.harness.cli.entry).
        pool.shutdown(wait=finished, cancel_futures=True)
        programs.settle_pending(grace_s=0.0 if finished else STOP_GRACE_S)


def _start_case(runner: Runner, pool, case, plan: PathPlan) -> CaseAhead:
    """Load `case`'s fixture and start, in `pool`, its oracle answer, then its programs, then its
    lowering and compile rows (in the order the case needs them). The fixture, oracle and programs
    are left to `Runner.case_steps` where the case needs no numbers (`PathPlan.needs_numbers`) or
    loading the fixture failed (it meets the error again and reports it). All of it is background
    work, which a timed path waits for."""
    fixture = oracle = None
    if plan.needs_numbers(case):
        try:
            fixture = runner.load_fixture(case)
        except Exception:  # noqa: BLE001 - reported by run_case
            fixture = None
    if fixture is not None:
        oracle = pool.submit(QUIET.run_in_background, runner.collaborators.oracle, case, fixture)
        runner.collaborators.programs.compile_ahead(pool, runnable(plan.paths_for(case), case), case, fixture)
    if not plan.lowering:
        return CaseAhead(fixture, oracle)
    lowering = pool.submit(QUIET.run_in_background, runner.lowering_rows, case, plan)
    compile_ = pool.submit(QUIET.run_in_background, runner.compile_rows, case, plan)
    return CaseAhead(fixture, oracle, lowering, compile_)


class _CaseSteps:
    """One case's `Runner.case_steps`: its rows so far, and the `TimingPoint` it waits at (None once done)."""

    def __init__(self, case, steps):
        self.case, self.steps, self.rows, self.point = case, steps, [], None

    def advance(self, timed: dict | None = None) -> bool:
        """Go on (sent `timed`, the point's results timed) to the next timing point: True if it waits
        at one, False once every row is made."""
        try:
            item = self.steps.send(timed)
            while not isinstance(item, TimingPoint):
                self.rows.append(item)
                item = next(self.steps)
        except StopIteration:
            self.point = None
            return False
        self.point = item
        return True


def _time_now(runner: Runner, waiting: list[_CaseSteps], *, last: bool) -> bool:
    """Whether the waiting cases are timed now: the last case, nothing to wait for (the pool is idle
    or the newest case times nothing on the device), or `TIMED_TOGETHER` cases or bytes reached."""
    points = [w.point for w in waiting if w.point is not None]
    return (
        last
        or not QUIET.busy
        or not waits_for_device(runner.collaborators.programs, points[-1])
        or len(points) >= TIMED_TOGETHER
        or sum(point.kept_bytes for point in points) >= TIMED_TOGETHER_BYTES
    )


def _finish(runner: Runner, waiting: list[_CaseSteps]) -> Iterator[tuple[object, list[dict]]]:
    """Time the waiting cases' points at once, then finish each case and yield (case, its rows) in order;
    `waiting` is left empty."""
    pending = [w for w in waiting if w.point is not None]
    for case_steps, timed in zip(pending, runner.time_points([w.point for w in pending])):
        while case_steps.advance(timed):  # a case times once; any later point is timed alone
            timed = runner.time_points([case_steps.point])[0]
    finished, waiting[:] = list(waiting), []
    for case_steps in finished:
        yield case_steps.case, case_steps.rows
