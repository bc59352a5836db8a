"""Run cases through paths and yield their rows: a case's stages, in order. For one case: its fixture,
the float64 oracle and every planned path (`path_results`), then its judged rows (`case_judging`),
then the kernels' lowering and compile rows. A path that cannot run yields status rows instead
(`skip`, `unsupported`, `fail`, or `error`, and the run goes on). `Runner.run` works cases ahead
(`cases_ahead`); what the runner works with is one declared bundle (`collaborators.Collaborators`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterable, Iterator

from mhc_parity.harness.engine.case_judging import CaseJudge
from mhc_parity.harness.engine.case_memory import oracle_memory_bytes
from mhc_parity.harness.engine.cases_ahead import NOTHING_AHEAD, CaseAhead, cases_ahead
from mhc_parity.harness.engine.cause_store import CauseStore
from mhc_parity.harness.engine.collaborators import Collaborators
from mhc_parity.harness.engine.comparison_store import ComparisonStore
from mhc_parity.harness.engine.compile_rows import compile_rows
from mhc_parity.harness.engine.compile_store import CompileStore
from mhc_parity.harness.engine.failures import error_text, out_of_memory, out_of_memory_error
from mhc_parity.harness.engine.lowering_rows import implementation_lowering_rows, lowering_rows
from mhc_parity.harness.engine.path_results import (
    PathResult,
    TimingPoint,
    run_path,
    runnable,
    status_rows,
    timed_together,
    unsupported_result,
)
from mhc_parity.harness.engine.paths import Path
from mhc_parity.harness.engine.plan import PathPlan, numbers_refusal
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.program_store import LoweringStore, ProgramStore
from mhc_parity.harness.engine.quiet import QUIET
from mhc_parity.harness.engine.run_info import compile_counts
from mhc_parity.harness.errors import ResourceError
from mhc_parity.harness.judging.policy import Policy
from mhc_parity.mhc.common import UnsupportedInputError

__all__ = ["PathPlan", "Runner", "StepCallback"]

# Told (case, step) as a case moves on: "fixture", "oracle", a path name, "lowering".
StepCallback = Callable[[object, str], None]

# Seconds this thread spent on each part of a run (`Runner.timings`), for the run's metadata. paths_s
# is the sum of its four parts: waiting for the case's programs, their first calls, waiting for the
# process to be quiet, timing on the device.
PATHS_PARTS = ("programs_wait_s", "first_calls_s", "quiet_wait_s", "device_timing_s")
TIMINGS = (
    "fixtures_s",
    "oracle_s",
    "paths_s",
    *PATHS_PARTS,
    "effects_s",
    "compare_s",
    "causes_s",
    "lowering_s",
    "compile_s",
)


def _no_step(case, step: str) -> None:
    pass


def oracle_memory_fields(case, oracle) -> dict:
    """The `oracle_peak_bytes` and `oracle_budget_bytes` columns of a case's rows: the peak resident memory
    of the oracle's own process (NaN where it was computed inside the run's) and the budget it ran under
    (one chunk at a time's where the answer states none)."""
    peak, budget = oracle.peak_bytes, oracle.budget_bytes
    return {
        "oracle_peak_bytes": math.nan if peak is None else float(peak),
        "oracle_budget_bytes": float(oracle_memory_bytes(case) if budget is None else budget),
    }


class Runner:
    """Runs cases under `policy` with `collaborators` (default: `Collaborators()`, no disk store but the
    fixtures' and oracle answers'); holds the compiled programs shared across cases. `with_disk_stores`
    builds a parity run's runner."""

    def __init__(self, policy: Policy, collaborators: Collaborators | None = None):
        self.policy = policy
        self.collaborators = collaborators if collaborators is not None else Collaborators()
        # This thread's seconds per part of the run (`TIMINGS`), for the run's metadata and the benchmark.
        self.timings = dict.fromkeys(TIMINGS, 0.0)
        self.judge = CaseJudge(policy, self.collaborators, self.timings)

    @classmethod
    def with_disk_stores(cls, policy: Policy) -> Runner:
        """The runner of a parity run: compiled programs, lowering and compile results, causes and judged rows
        stored on disk by content, besides the fixtures and oracle answers (their keys cover any foreign code
        this process loaded)."""
        return cls(
            policy,
            Collaborators(
                programs=ProgramCache(store=ProgramStore()),
                lowering_store=LoweringStore(),
                compile_store=CompileStore(),
                cause_store=CauseStore(),
                comparison_store=ComparisonStore(),
            ),
        )

    def work_counts(self) -> dict:
        """Programs this process compiled and loaded (`mhc_parity.harness.engine.run_info.compile_counts`:
        XLA's and JAX's persistent cache), then what the collaborators computed, loaded and missed
        (`Collaborators.counts`)."""
        return {**compile_counts(), **self.collaborators.counts()}

    # -- one case ------------------------------------------------------------------

    def run_case(
        self, case, plan: PathPlan, on_step: StepCallback = _no_step, ahead: CaseAhead = NOTHING_AHEAD
    ) -> Iterator[dict]:
        """Yield every row of one case, its paths timed on the device as soon as they ran; ahead: what
        the caller made for the case already (its fixture, say). Memory running out at any stage is
        the machine's limit, not a row: a `ResourceError` naming the case and the stage."""
        steps = self.case_steps(case, plan, on_step, ahead)
        timed = None
        while True:
            try:
                item = steps.send(timed)
            except StopIteration:
                return
            timed = None
            if isinstance(item, TimingPoint):
                timed = self.time_points([item])[0]
            else:
                yield item

    def case_steps(
        self, case, plan: PathPlan, on_step: StepCallback = _no_step, ahead: CaseAhead = NOTHING_AHEAD
    ) -> Generator[dict | TimingPoint, dict | None, None]:
        """`run_case`'s rows, with one `TimingPoint` among them where the case's paths wait to be timed:
        the caller sends back its results timed (`time_points`), when it chooses (`cases_ahead` times
        several cases at once). ahead: what the caller started for the case (an error in it met as
        if made here)."""
        stage = ["its fixture or oracle"]  # where the case is, for that error
        try:
            yield from self._case_rows(case, plan, on_step, ahead, stage)
        except ResourceError:
            raise
        except Exception as exc:
            if out_of_memory(exc):
                raise out_of_memory_error(case, stage[0], exc) from exc
            raise

    def time_points(self, points: list[TimingPoint]) -> list[dict]:
        """`path_results.timed_together` of `points`, its waiting and timing seconds counted."""
        start, waited = time.perf_counter(), QUIET.waited_s
        try:
            return timed_together(self.collaborators.programs, points)
        finally:
            quiet_wait = QUIET.waited_s - waited
            timing = time.perf_counter() - start - quiet_wait
            self.timings["quiet_wait_s"] += quiet_wait
            self.timings["device_timing_s"] += timing
            self.timings["paths_s"] += quiet_wait + timing

    def _case_rows(self, case, plan: PathPlan, on_step: StepCallback, ahead: CaseAhead, stage: list) -> Iterator[dict]:
        """`run_case`'s rows; `stage[0]` names the stage the case is in."""
        paths = plan.paths_for(case)
        if plan.needs_numbers(case):
            compared = yield from self._numeric_rows(case, plan, on_step, ahead, stage)
            if not compared:  # the fixture or the oracle failed: the case ends with its paths' status rows
                return
        else:  # no fixture, no oracle: the refused paths' skip rows (no paths selected: none)
            refused = PathResult(verdict="skip", reason=numbers_refusal(case))
            for path in paths:
                yield from status_rows(case, path, paths, refused)
        if plan.lowering:
            yield from self._lowering_and_compile_rows(case, plan, on_step, ahead, stage)

    def _numeric_rows(
        self, case, plan: PathPlan, on_step: StepCallback, ahead: CaseAhead, stage: list
    ) -> Generator[dict, None, bool]:
        """The rows of the case's paths, from its fixture and oracle answer (`ahead`'s where started
        there); returns (a generator's return) False when the fixture or the oracle failed and the
        case's rows end with its paths' status rows, else True."""
        paths = plan.paths_for(case)
        try:
            on_step(case, "fixture")
            fixture = self.load_fixture(case) if ahead.fixture is None else ahead.fixture
            on_step(case, "oracle")
            if ahead.oracle is None:
                oracle = self.collaborators.oracle(case, fixture)
                self.timings["oracle_s"] += oracle.execute_s
            else:  # computed in a pool thread, overlapping other work: count this thread's wait
                start = time.perf_counter()
                oracle = ahead.oracle.result()
                self.timings["oracle_s"] += time.perf_counter() - start
        except UnsupportedInputError as exc:
            # The math itself rejects the case (e.g. too many streams for mHC-lite).
            for path in paths:
                yield from status_rows(case, path, paths, unsupported_result(path, case, exc))
            return False
        except Exception as exc:
            if out_of_memory(exc):
                raise out_of_memory_error(case, "its fixture or oracle", exc) from exc
            for path in paths:
                yield from status_rows(case, path, paths, PathResult(verdict="error", reason=error_text(exc)))
            return False

        stage[0] = "its paths"
        memory = oracle_memory_fields(case, oracle)
        results = self._run_paths(case, paths, fixture, on_step)
        kept = sum(a.nbytes for r in results.values() if r.outputs for a in r.outputs.leaves.values())
        kept += sum(a.nbytes for a in oracle.leaves.values())
        results = yield TimingPoint(case, paths, fixture, results, kept)
        stage[0] = "the comparisons and causes"
        rows = self.judge.rows(case, paths, results, fixture, oracle, plan.causes)
        yield from ({**row, **memory} for row in rows)
        return True

    def _lowering_and_compile_rows(
        self, case, plan: PathPlan, on_step: StepCallback, ahead: CaseAhead, stage: list
    ) -> Iterator[dict]:
        """The kernels' TPU lowering rows, then their compile rows (`ahead`'s where started there),
        this thread's seconds making or waiting for them counted."""
        for name, step, rows_of, future in (
            ("lowering", "the TPU lowering", self.lowering_rows, ahead.lowering),
            ("compile", "the TPU compile", self.compile_rows, ahead.compile),
        ):
            stage[0] = step
            on_step(case, name)
            start = time.perf_counter()
            rows = rows_of(case, plan) if future is None else future.result()
            self.timings[f"{name}_s"] += time.perf_counter() - start
            yield from rows

    def lowering_rows(self, case, plan: PathPlan) -> list[dict]:
        """The case's TPU lowering rows: this project's kernels', then each implementation's that lowers its own."""
        lowering_store = self.collaborators.lowering_store
        rows = list(lowering_rows(case, lowering_store, plan.selects))
        for impl in plan.implementations:
            if impl.lower is not None:
                rows += implementation_lowering_rows(case, impl, lowering_store, plan.selects)
        return rows

    def compile_rows(self, case, plan: PathPlan) -> list[dict]:
        """The case's TPU compile rows (`compile_rows.compile_rows`)."""
        return list(compile_rows(case, self.collaborators.compile_store, plan.selects, plan.implementations))

    def load_fixture(self, case):
        """`case`'s fixture from the fixture loader, its seconds counted in `fixtures_s`."""
        start = time.perf_counter()
        try:
            return self.collaborators.fixture_loader(case)
        finally:
            self.timings["fixtures_s"] += time.perf_counter() - start

    def _run_paths(self, case, paths: list[Path], fixture, on_step: StepCallback) -> dict[str, PathResult]:
        """Every path's result (name -> `PathResult`) from its first call: the programs the case needs are
        compiled at once (on all cores; `run` started them cases ahead), then run in turn."""
        programs = self.collaborators.programs
        start = time.perf_counter()
        on_step(case, "compiling programs")  # a cold run's first cases wait here for minutes
        programs.prepare(runnable(paths, case), case, fixture)
        prepared = time.perf_counter()
        results = {}
        for path in paths:
            on_step(case, path.name)
            results[path.name] = run_path(programs, path, case, fixture)
        end = time.perf_counter()
        self.timings["programs_wait_s"] += prepared - start
        self.timings["first_calls_s"] += end - prepared
        self.timings["paths_s"] += end - start
        return results

    # -- many cases ------------------------------------------------------------------

    def run(
        self, cases: Iterable, plan: PathPlan, *, on_case_start=None, on_step: StepCallback = _no_step
    ) -> Iterator[tuple[object, list[dict]]]:
        """Yield (case, its rows) for each case in order. Where the programs compile ahead
        (`PathPrograms.compiles_ahead`), the next cases' oracle answers and programs are obtained
        meanwhile (`cases_ahead`); the rows are the same either way."""
        cases = list(cases)
        if self.collaborators.programs.compiles_ahead:
            yield from cases_ahead(self, cases, plan, on_case_start, on_step)
            return
        for case in cases:  # e.g. the kill matrix's recording caches
            if on_case_start is not None:
                on_case_start(case)
            yield case, list(self.run_case(case, plan, on_step))
