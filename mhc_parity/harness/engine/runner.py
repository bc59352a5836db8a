"""Run cases through paths and yield judged rows. For one case: its fixture, the float64 oracle and
every planned path, then each leaf a row of

  every path                  vs the oracle         ("vs_oracle")
  every non-reference path    vs reference, same sharding ("vs_reference")
  every token-sharded path    vs itself unsharded   ("vs_unsharded")

and the kernels' lowering and compile rows. A path that cannot run yields status rows instead
(`skip`, `unsupported`, `fail`, or `error`, and the run goes on)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence

import jax

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.case_memory import oracle_memory_bytes
from mhc_parity.harness.engine.causes import HypothesisOracle, annotate_causes, not_searched
from mhc_parity.harness.engine.compare import compare_leaves, status_row
from mhc_parity.harness.engine.compile_rows import compile_rows
from mhc_parity.harness.engine.devices import Placement, PlacementError, path_placement, precision_label, runs_on_host
from mhc_parity.harness.engine.execution_timing import times_alone
from mhc_parity.harness.engine.failures import error_text, last_frame, out_of_memory, out_of_memory_error
from mhc_parity.harness.engine.interpret_cost import interpret_refusal
from mhc_parity.harness.engine.kernel_blocks import path_blocks
from mhc_parity.harness.engine.lowering_rows import implementation_lowering_rows, lowering_rows
from mhc_parity.harness.engine.oracle_process import compute_apart
from mhc_parity.harness.engine.paths import ORACLE_PATH, Path, PathOutputs
from mhc_parity.harness.engine.plan import PathPlan, comparisons_of, mosaic_xla_pair, numbers_refusal
from mhc_parity.harness.engine.precision_choices import DeclaredEffects, measured_effects
from mhc_parity.harness.engine.program_cache import COMPILE_THREADS, ProgramCache
from mhc_parity.harness.engine.quiet import QUIET
from mhc_parity.harness.engine.run_info import compile_counts
from mhc_parity.harness.errors import ResourceError
from mhc_parity.harness.judging.metrics import MetricsMemo
from mhc_parity.harness.judging.policy import Policy
from mhc_parity.harness.stores.cause_store import CauseStore
from mhc_parity.harness.stores.comparison_store import ComparisonStore, key_material, path_material
from mhc_parity.harness.stores.compile_store import CompileStore
from mhc_parity.harness.stores.oracle_cache import OracleCache
from mhc_parity.harness.stores.program_store import LoweringStore, ProgramStore
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.precision import device_compute_capability

__all__ = ["PathPlan", "Runner", "StepCallback"]

# Told (case, step) as a case moves on: "fixture", "oracle", a path name, "lowering".
StepCallback = Callable[[object, str], None]
# Asked (case, candidate path, comparison, partner path or None for the oracle) before a
# comparison is made: the rows another run of the case made for it, if they are this run's
# too (the kill matrix's clean rows, where a perturbation changes neither path), else None.
RecordedRows = Callable[[object, Path, str, Path | None], Sequence[dict] | None]

# Seconds this thread spent on each part of a run (`Runner.timings`), for the run's metadata.
TIMINGS = ("fixtures_s", "oracle_s", "paths_s", "effects_s", "compare_s", "causes_s", "lowering_s", "compile_s")
# Cases ahead of the running one whose programs `Runner.run` starts compiling: enough to
# keep the compile threads busy while a case's oracle and comparisons run.
COMPILE_AHEAD_CASES = 3
# How long a run stopped early waits for the programs being compiled ahead before it drops
# them: long enough for a normal compile to land, short enough for one Ctrl-C to feel prompt.
STOP_GRACE_S = 5.0
# How long a case's timing phase waits for the background work under way (the next cases'
# oracle answers and compiles) to end: an oracle at the `tpu` suite's sizes takes minutes. Past
# it (a task stuck in the code under test) the paths keep their first call's time, one run.
QUIET_WAIT_S = 900.0


def _no_step(case, step: str) -> None:
    pass


@dataclasses.dataclass
class _PathResult:
    outputs: PathOutputs | None = None
    verdict: str = ""  # set when the path did not produce outputs (or must fail anyway)
    reason: str = ""
    placement: Placement | None = None  # where it ran (None if it could not be placed)


def oracle_memory_fields(case, oracle) -> dict:
    """The `oracle_peak_bytes` and `oracle_budget_bytes` columns of a case's rows: the peak resident memory
    of the oracle's own process (NaN where it was computed inside the run's) and the budget it ran under
    (one chunk at a time's where the answer states none)."""
    peak = getattr(oracle, "peak_bytes", None)
    budget = getattr(oracle, "budget_bytes", None)
    return {
        "oracle_peak_bytes": math.nan if peak is None else float(peak),
        "oracle_budget_bytes": float(oracle_memory_bytes(case) if budget is None else budget),
    }


def _last_readers(paths: Sequence[Path]) -> dict[str, int]:
    """Path name -> the index in `paths` of the last path whose comparisons read its leaves (as
    candidate or partner; `comparisons_of`); the oracle's leaves are read by every path."""
    last = {}
    for index, path in enumerate(paths):
        last[path.name] = index
        for _, partner in comparisons_of(path, paths):
            if partner != ORACLE_PATH:
                last[partner] = index
    return last


def _environment_fields(case, path: Path, placement: Placement | None) -> dict:
    """The `matmul_precision`, `devices` and `kernel_blocks` columns of a path's rows: the precision it
    effectively ran at on its devices and its kernels' blocks, or, for a path that could not be placed,
    the requested precision and no devices or blocks."""
    if placement is None:
        return {"matmul_precision": case.matmul_precision, "devices": "", "kernel_blocks": ""}
    device = placement.devices[0]
    precision = precision_label(case.matmul_precision, device.platform, device_compute_capability(device))
    blocks = path_blocks(case, path.impl, path.mesh)
    return {"matmul_precision": precision, "devices": placement.label, "kernel_blocks": blocks}


class Runner:
    """Runs cases; holds the compiled-program cache shared across cases."""

    def __init__(
        self,
        policy: Policy,
        *,
        fixture_loader: Callable | None = None,
        cache: ProgramCache | None = None,
        oracle: Callable | None = None,
        lowering_store: LoweringStore | None = None,
        compile_store: CompileStore | None = None,
        cause_store: CauseStore | None = None,
        comparison_store: ComparisonStore | None = None,
        hypotheses: HypothesisOracle | None = None,
        recorded_rows: RecordedRows | None = None,
    ):
        """fixture_loader(case) -> Fixture and oracle(case, fixture) -> OracleOutputs default to `make_fixture`
        and `OracleCache(apart=compute_apart)`, both cached on disk by content. cache: default a
        `ProgramCache` without a disk store. lowering_store, compile_store, cause_store, comparison_store:
        reuse earlier results (default: none). hypotheses: the causes' hypotheses (default: this runner's
        own; the kill matrix shares one across a case's passes). recorded_rows: see `RecordedRows` (default:
        every comparison is made). `with_disk_stores` builds a parity run's runner."""
        self.policy = policy
        self.fixture_loader = fixture_loader or make_fixture
        self.oracle = oracle if oracle is not None else OracleCache(apart=compute_apart)
        self.cache = cache if cache is not None else ProgramCache()  # an empty cache is falsy (len 0)
        self.lowering_store = lowering_store
        self.compile_store = compile_store
        self.cause_store = cause_store
        self.comparison_store = comparison_store
        # The failing rows' causes: a case's hypotheses through the oracle, the latest case kept.
        self.hypotheses = hypotheses if hypotheses is not None else HypothesisOracle()
        self.recorded_rows = recorded_rows
        # This thread's seconds per part of the run (`TIMINGS`), for the run's metadata and the benchmark.
        self.timings = dict.fromkeys(TIMINGS, 0.0)

    @classmethod
    def with_disk_stores(cls, policy: Policy) -> Runner:
        """The runner of a parity run: compiled programs, lowering and compile results, causes and judged rows
        stored on disk by content, besides the fixtures and oracle answers (their keys cover any foreign code
        this process loaded)."""
        return cls(
            policy,
            cache=ProgramCache(store=ProgramStore()),
            lowering_store=LoweringStore(),
            compile_store=CompileStore(),
            cause_store=CauseStore(),
            comparison_store=ComparisonStore(),
        )

    def work_counts(self) -> dict:
        """Oracle answers computed and loaded from the disk cache by this runner, programs
        this process compiled and loaded (`mhc_parity.harness.engine.run_info.compile_counts`: XLA's and JAX's
        persistent cache), and what the program and lowering stores loaded and missed."""
        counts = compile_counts()
        if hasattr(self.oracle, "misses"):
            counts.update(oracle_computed=self.oracle.misses, oracle_cached=self.oracle.hits)
        stores = (self.cache.store, self.lowering_store, self.compile_store, self.cause_store, self.comparison_store)
        for store in stores:
            if store is not None:
                counts.update(store.counts())
        return counts

    # -- one path ------------------------------------------------------------------

    def _skip_reason(self, path: Path, case) -> str:
        impl = path.impl
        reason = impl.case_skip_reason(case)
        if reason:
            return reason
        if impl.needs_backend and jax.default_backend() != impl.needs_backend:
            return f"{impl.name} needs a {impl.needs_backend} backend; this process runs on {jax.default_backend()}"
        return interpret_refusal(case, path)  # interpret mode at a size too costly to run

    def _run_path(self, path: Path, case, fixture) -> _PathResult:
        skip = self._skip_reason(path, case)
        if skip:
            return _PathResult(verdict="skip", reason=skip)
        outside = path.impl.envelope_reason(case, path.mesh)
        if outside:  # declared up front: the implementation is not called
            return _PathResult(verdict="unsupported", reason=f"{path.impl.name}: {outside}")
        try:
            placement = path_placement(path)
        except PlacementError as exc:
            return _PathResult(verdict="skip", reason=str(exc))
        expects_rejection = case.expects_unsupported and path.impl.case_limits
        try:
            outputs = self.cache.run(path, case, fixture)
        except UnsupportedInputError as exc:
            return dataclasses.replace(self._classify_unsupported(path, case, exc), placement=placement)
        except Exception as exc:  # reported as an `error` row; the run goes on
            if out_of_memory(exc):  # the machine's limit, not the code's: the run stops (exit 2)
                raise out_of_memory_error(case, path.name, exc) from exc
            return _PathResult(
                verdict="error", reason=error_text(exc) + last_frame(exc, path.impl.code_root), placement=placement
            )
        if expects_rejection:
            return _PathResult(
                outputs=outputs,
                verdict="fail",
                placement=placement,
                reason=f"{path.impl.name} accepted input the case expects it to reject ({case.expect_reason!r})",
            )
        return _PathResult(outputs=outputs, placement=placement)

    @staticmethod
    def _classify_unsupported(path: Path, case, exc: UnsupportedInputError) -> _PathResult:
        message = str(exc)
        if case.expects_unsupported and case.expect_reason in message:
            return _PathResult(verdict="unsupported", reason=message)
        if case.expects_unsupported:
            return _PathResult(
                verdict="fail", reason=f"rejected for another reason than {case.expect_reason!r}: {message}"
            )
        return _PathResult(verdict="fail", reason=f"{path.impl.name} rejected a supported case: {message}")

    # -- one case ------------------------------------------------------------------

    def run_case(
        self,
        case,
        plan: PathPlan,
        on_step: StepCallback = _no_step,
        *,
        fixture=None,
        oracle_ahead: concurrent.futures.Future | None = None,
    ) -> Iterator[dict]:
        """Yield every row of one case. fixture / oracle_ahead: the case's fixture and the future of its oracle
        answer where the caller (`run`) started them, else made here (an error met as if made here). Memory
        running out at any stage is the machine's limit, not a row: a `ResourceError` naming the case and
        the stage."""
        stage = ["its fixture or oracle"]  # where the case is, for that error
        try:
            yield from self._case_rows(case, plan, on_step, fixture, oracle_ahead, stage)
        except ResourceError:
            raise
        except Exception as exc:
            if out_of_memory(exc):
                raise out_of_memory_error(case, stage[0], exc) from exc
            raise

    def _case_rows(
        self, case, plan: PathPlan, on_step: StepCallback, fixture, oracle_ahead, stage: list
    ) -> Iterator[dict]:
        """`run_case`'s rows; `stage[0]` names the stage the case is in."""
        paths = plan.paths_for(case)
        if plan.needs_numbers(case):
            compared = yield from self._numeric_rows(case, plan, on_step, fixture, oracle_ahead, stage)
            if not compared:  # the fixture or the oracle failed: the case ends with its paths' status rows
                return
        else:  # no fixture, no oracle: the refused paths' skip rows (no paths selected: none)
            refused = _PathResult(verdict="skip", reason=numbers_refusal(case))
            for path in paths:
                yield from self._status_rows(case, path, paths, refused)
        if plan.lowering:
            stage[0] = "the TPU lowering"
            on_step(case, "lowering")
            start = time.perf_counter()
            rows = list(lowering_rows(case, self.lowering_store, plan.selects))
            for impl in plan.implementations:
                if impl.lower is not None:
                    rows += implementation_lowering_rows(case, impl, self.lowering_store, plan.selects)
            self.timings["lowering_s"] += time.perf_counter() - start
            yield from rows
            stage[0] = "the TPU compile"
            on_step(case, "compile")
            start = time.perf_counter()
            rows = list(compile_rows(case, self.compile_store, plan.selects, plan.implementations))
            self.timings["compile_s"] += time.perf_counter() - start
            yield from rows

    def _numeric_rows(
        self, case, plan: PathPlan, on_step: StepCallback, fixture, oracle_ahead, stage: list
    ) -> Generator[dict, None, bool]:
        """The rows of the case's paths, from its fixture and oracle answer (`run_case`'s
        arguments); returns (a generator's return) False when the fixture or the oracle failed
        and the case's rows end with its paths' status rows, else True."""
        paths = plan.paths_for(case)
        try:
            on_step(case, "fixture")
            if fixture is None:
                fixture = self._load_fixture(case)
            on_step(case, "oracle")
            if oracle_ahead is None:
                oracle = self.oracle(case, fixture)
                self.timings["oracle_s"] += oracle.execute_s
            else:  # computed in a pool thread, overlapping other work: count this thread's wait
                start = time.perf_counter()
                oracle = oracle_ahead.result()
                self.timings["oracle_s"] += time.perf_counter() - start
        except UnsupportedInputError as exc:
            # The math itself rejects the case (e.g. too many streams for mHC-lite).
            for path in paths:
                result = self._classify_unsupported(path, case, exc)
                yield from self._status_rows(case, path, paths, result)
            return False
        except Exception as exc:
            if out_of_memory(exc):
                raise out_of_memory_error(case, "its fixture or oracle", exc) from exc
            for path in paths:
                yield from self._status_rows(case, path, paths, _PathResult(verdict="error", reason=error_text(exc)))
            return False

        stage[0] = "its paths"
        memory = oracle_memory_fields(case, oracle)
        results = self._run_paths(case, paths, fixture, on_step)
        stage[0] = "the comparisons and causes"
        timings = {name: result.outputs.timing for name, result in results.items() if result.outputs is not None}
        material = self._comparison_key(case, fixture, paths, results)
        rows = None if material is None else self.comparison_store.load(material, timings)
        if rows is None:
            rows = self._judged_rows(case, paths, results, fixture, oracle, plan.causes)
            if material is not None and plan.causes:  # rows without causes are no later run's
                self.comparison_store.save(material, rows, timings)
        yield from ({**row, **memory} for row in rows)
        return True

    def _comparison_key(self, case, fixture, paths: Sequence[Path], results: dict[str, _PathResult]) -> dict | None:
        """The key of the case's judged rows in the comparison store (None without one)."""
        if self.comparison_store is None:
            return None
        return key_material(
            case,
            fixture,
            self.policy.digest,
            [
                path_material(
                    path.name,
                    verdict=results[path.name].verdict,
                    reason=results[path.name].reason,
                    devices=_environment_fields(case, path, results[path.name].placement)["devices"],
                    leaves=None if results[path.name].outputs is None else results[path.name].outputs.leaves,
                )
                for path in paths
            ],
        )

    def _judged_rows(
        self, case, paths: Sequence[Path], results: dict[str, _PathResult], fixture, oracle, causes: bool = True
    ) -> list:
        """The case's comparison and status rows, their bounds and verdicts, and the failing rows'
        causes (without `causes`, each failing row says they were not searched)."""
        # Once per implementation: its sharded and unsharded paths make the same choices.
        implementations = {path.impl.name: path.impl for path in paths}
        start = time.perf_counter()
        effects = {name: self._effects_of(impl, case, fixture, oracle) for name, impl in implementations.items()}
        declared = {path.name: effects[path.impl.name] for path in paths}
        self.timings["effects_s"] += time.perf_counter() - start
        start = time.perf_counter()  # the metrics and bounds of every row: one core, a leaf at a time
        rows = list(self._compared_rows(case, paths, results, oracle, declared))
        self.timings["compare_s"] += time.perf_counter() - start
        start = time.perf_counter()
        ran = {name: result.outputs.leaves for name, result in results.items() if result.outputs is not None}
        widened = {name: effects.widened(oracle.sensitivity) for name, effects in declared.items() if effects.rms}
        annotate = functools.partial(
            annotate_causes,
            rows,
            case,
            fixture,
            oracle_leaves=oracle.leaves,
            oracle_sensitivity=oracle.sensitivity,
            candidate_leaves=ran,
            hypotheses=self.hypotheses,
            candidate_sensitivity=widened,
            elsewhere={path.name for path in paths if path.name in ran and not runs_on_host(path)},
        )
        if not causes:
            rows = not_searched(rows, ran, oracle.leaves)
        elif self.cause_store is None:
            rows = annotate()
        else:
            rows = self.cause_store.causes(rows, case, fixture, oracle, ran, widened, annotate)
        self.timings["causes_s"] += time.perf_counter() - start
        return rows

    def _effects_of(self, impl, case, fixture, oracle) -> DeclaredEffects:
        """What the precision choices `impl` declares and this backend makes move, leaf by leaf
        (`mhc_parity.harness.engine.precision_choices.measured_effects`): its rows' bounds widen by
        them. From the cause store where the runner has one and `impl` declares choices."""

        def measure():
            return measured_effects(impl.precision_choices, case, fixture, oracle.leaves, self.hypotheses)

        if self.cause_store is None or not impl.precision_choices:
            return measure()
        return self.cause_store.declared_effects(impl.precision_choices, case, fixture, oracle, measure)

    def _compared_rows(
        self, case, paths: Sequence[Path], results: dict[str, _PathResult], oracle, declared: dict
    ) -> Iterator[dict]:
        """Every path's rows of one case: its comparisons, or status rows where it did not run.
        declared: path name -> its `DeclaredEffects` (`_effects_of`)."""
        memo = MetricsMemo()  # the case's comparisons share arrays (the oracle's leaves above all)
        by_name = {path.name: path for path in paths}
        last_reader = _last_readers(paths)
        for index, path in enumerate(paths):
            # Leaves no comparison from here on reads: the memo's float64 copies of them go, else
            # they are most of the case's memory (issue 55: 16 paths at 8192 tokens, 27 GB).
            done = (results[name].outputs for name, last in last_reader.items() if last == index - 1)
            memo.forget(leaf for outputs in done if outputs is not None for leaf in outputs.leaves.values())
            result = results[path.name]
            environment = _environment_fields(case, path, result.placement)
            if result.outputs is None or result.verdict == "fail":
                yield from self._status_rows(case, path, paths, result)
                continue
            timing = result.outputs.timing
            for comparison, partner in comparisons_of(path, paths):
                if partner == ORACLE_PATH:
                    partner_leaves = oracle.leaves
                else:
                    partner_result = results[partner]
                    if partner_result.outputs is None:
                        row = status_row(
                            case,
                            candidate=path.name,
                            partner=partner,
                            comparison=comparison,
                            verdict="skip",
                            reason=f"partner did not run ({partner_result.verdict}: {partner_result.reason})",
                        )
                        yield {**row, **environment}
                        continue
                    partner_leaves = partner_result.outputs.leaves
                partner_path = None if partner == ORACLE_PATH else by_name[partner]
                recorded = self._recorded(case, path, comparison, partner_path)
                if recorded is not None:
                    yield from (dict(row) for row in recorded)
                    continue
                # A Mosaic kernel against XLA on the same backend: only the terms the two compute differently.
                pair = oracle.kernel_pair if mosaic_xla_pair(path, partner_path) else None
                statistics = oracle if pair is None else pair
                for row in compare_leaves(
                    case,
                    candidate=path.name,
                    partner=partner,
                    comparison=comparison,
                    candidate_leaves=result.outputs.leaves,
                    partner_leaves=partner_leaves,
                    oracle_leaves=oracle.leaves,
                    oracle_sensitivity=declared[path.name].widened(statistics.sensitivity),
                    oracle_systematic=declared[path.name].widened_systematic(statistics.systematic),
                    oracle_backend_shift=statistics.backend_shift,
                    declared=declared[path.name].max,
                    policy=self.policy,
                    timing=timing,
                    partitioning=path.impl.partitioning(get_branch(case.branch).elementwise),
                    memo=memo,
                ):
                    yield {**row, **environment}

    def _recorded(self, case, path: Path, comparison: str, partner: Path | None) -> Sequence[dict] | None:
        """The rows `recorded_rows` has for this comparison (partner None: the oracle), or None."""
        return None if self.recorded_rows is None else self.recorded_rows(case, path, comparison, partner)

    def _load_fixture(self, case):
        start = time.perf_counter()
        try:
            return self.fixture_loader(case)
        finally:
            self.timings["fixtures_s"] += time.perf_counter() - start

    def _runnable(self, paths: Sequence[Path], case) -> list[Path]:
        """The paths that do not skip `case` and hold it in their envelope (whose programs are worth compiling)."""
        return [p for p in paths if not self._skip_reason(p, case) and not p.impl.envelope_reason(case, p.mesh)]

    def _run_paths(self, case, paths: Sequence[Path], fixture, on_step: StepCallback) -> dict[str, _PathResult]:
        """Every path's result (name -> `_PathResult`): the programs the case needs are
        compiled at once (on all cores; `run` started them cases ahead), then run in turn,
        then those on an accelerator timed alone (`_time_alone`)."""
        start = time.perf_counter()
        on_step(case, "compiling programs")  # a cold run's first cases wait here for minutes
        self.cache.prepare(self._runnable(paths, case), case, fixture)
        results = {}
        for path in paths:
            on_step(case, path.name)
            results[path.name] = self._run_path(path, case, fixture)
        self._time_alone(case, paths, fixture, results)
        self.timings["paths_s"] += time.perf_counter() - start
        return results

    def _time_alone(self, case, paths: Sequence[Path], fixture, results: dict[str, _PathResult]) -> None:
        """Replace the first-call time of each path that ran on an accelerator by its device time, with nothing
        else in the process running (`QUIET.alone`), once per case after all its paths ran. A path whose
        timing raises becomes an `error` row; where the background work does not end within `QUIET_WAIT_S`,
        every path keeps its first call's time."""
        timed = [
            path
            for path in paths
            if results[path.name].outputs is not None
            and results[path.name].verdict != "fail"
            and times_alone(results[path.name].placement.platform)
        ]
        if not timed or not hasattr(self.cache, "device_time"):  # the kill matrix's recording caches
            return
        with QUIET.alone(QUIET_WAIT_S) as quiet:
            if not quiet:
                return
            for path in timed:
                result = results[path.name]
                try:
                    run_s, runs = self.cache.device_time(path, case, fixture)
                except Exception as exc:
                    if out_of_memory(exc):
                        raise out_of_memory_error(case, path.name, exc) from exc
                    result.verdict, result.outputs = "error", None
                    result.reason = f"timing its program failed: {error_text(exc)}"
                    continue
                result.outputs = dataclasses.replace(result.outputs, execute_s=run_s, execute_runs=runs)

    def _status_rows(self, case, path: Path, paths: Sequence[Path], result: _PathResult) -> Iterator[dict]:
        environment = _environment_fields(case, path, result.placement)
        for comparison, partner in comparisons_of(path, paths):
            row = status_row(
                case,
                candidate=path.name,
                partner=partner,
                comparison=comparison,
                verdict=result.verdict,
                reason=result.reason,
            )
            yield {**row, **environment}

    # -- many cases ------------------------------------------------------------------

    def run(
        self, cases: Iterable, plan: PathPlan, *, on_case_start=None, on_step: StepCallback = _no_step
    ) -> Iterator[tuple[object, list[dict]]]:
        """Yield (case, its rows) for each case in order. With a cache that can compile ahead, the oracle
        answers and programs of the next `COMPILE_AHEAD_CASES` cases are obtained in a thread pool meanwhile
        (the oracle callable must then be thread-safe, as `OracleCache` is); the rows are the same either way."""
        cases = list(cases)
        if not hasattr(self.cache, "compile_ahead"):  # e.g. the kill matrix's recording caches
            for case in cases:
                if on_case_start is not None:
                    on_case_start(case)
                yield case, list(self.run_case(case, plan, on_step))
            return
        started: dict[int, tuple[object, concurrent.futures.Future | None]] = {}
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix="compile-ahead")
        finished = False
        try:
            for index, case in enumerate(cases):
                for ahead in range(index, min(index + 1 + COMPILE_AHEAD_CASES, len(cases))):
                    if ahead not in started:
                        started[ahead] = self._start_case(pool, cases[ahead], plan)
                if on_case_start is not None:
                    on_case_start(case)
                fixture, oracle_ahead = started.pop(index)
                yield case, list(self.run_case(case, plan, on_step, fixture=fixture, oracle_ahead=oracle_ahead))
            finished = True
        finally:
            # Stopped early (Ctrl-C, an error, the caller): a pool thread may be stuck in the
            # code under test, so programs being compiled get `STOP_GRACE_S`, not forever
            # (the command abandons a stuck thread: mhc_parity.harness.cli.entry).
            pool.shutdown(wait=finished, cancel_futures=True)
            self.cache.settle_pending(grace_s=0.0 if finished else STOP_GRACE_S)

    def _start_case(self, pool, case, plan: PathPlan) -> tuple[object, concurrent.futures.Future | None]:
        """Load `case`'s fixture and start its oracle answer, then its programs, in `pool`:
        (fixture, the answer's future), or (None, None) if loading the fixture failed
        (`run_case` then meets the error again and reports it) or the case needs no numbers
        (`PathPlan.needs_numbers`)."""
        if not plan.needs_numbers(case):
            return None, None
        try:
            fixture = self._load_fixture(case)
        except Exception:  # noqa: BLE001 - reported by run_case
            return None, None
        # first: the case needs it before its paths; background work, which a timed path waits for
        oracle = pool.submit(QUIET.run_in_background, self.oracle, case, fixture)
        self.cache.compile_ahead(pool, self._runnable(plan.paths_for(case), case), case, fixture)
        return fixture, oracle
