"""The kill matrix's passes: the unmodified code, then each perturbation injected, case by case.

A case's passes share what no perturbation can change (docs/speed.md): its fixture and oracle answer, its
causes' hypotheses, the outputs and rows of the paths a perturbation does not affect, and the clean programs
(from the program store; every injection shuts the stores). So a case is the unit of work.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax

from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.causes import HypothesisOracle
from mhc_parity.harness.engine.collaborators import Collaborators, OracleFunction, RunOnlyPrograms, no_recorded_rows
from mhc_parity.harness.engine.fit_store import FitStore
from mhc_parity.harness.engine.oracle_cache import OracleCache
from mhc_parity.harness.engine.paths import ORACLE_PATH
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.program_store import ProgramStore
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.faults.model import Perturbation


def _plan(impls) -> PathPlan:
    return PathPlan(implementations=tuple(impls), lowering=False)


class _RecordingProgramCache(RunOnlyPrograms):
    """A `ProgramCache` (default a fresh one) that remembers each (case, path)'s outputs, or exception, in
    `memo`."""

    def __init__(self, memo: dict, cache: ProgramCache | None = None):
        self._cache = cache if cache is not None else ProgramCache()
        self.memo = memo

    def prepare(self, paths, case, fixture) -> None:
        self._cache.prepare(paths, case, fixture)

    def run(self, path, case, fixture):
        key = (case.name, path.name)
        try:
            outputs = self._cache.run(path, case, fixture)
        except Exception as exc:
            self.memo[key] = exc
            raise
        self.memo[key] = outputs
        return outputs


class _PerturbationScopedProgramCache(RunOnlyPrograms):
    """A fresh `ProgramCache` for the paths `perturbation` affects; recorded clean results for the rest."""

    def __init__(self, memo: dict, perturbation: Perturbation):
        self._cache = ProgramCache()
        self.memo = memo
        self.perturbation = perturbation

    def recorded(self, path, case) -> bool:
        return not self.perturbation.affects_path(path) and (case.name, path.name) in self.memo

    def prepare(self, paths, case, fixture) -> None:
        self._cache.prepare([p for p in paths if not self.recorded(p, case)], case, fixture)

    def run(self, path, case, fixture):
        if self.recorded(path, case):
            recorded = self.memo[(case.name, path.name)]
            if isinstance(recorded, BaseException):
                raise recorded
            return recorded
        return self._cache.run(path, case, fixture)


class _CleanComparisons:
    """The clean pass's rows by (case, candidate, comparison, partner), for a perturbed runner's comparisons
    whose candidate and partner keep their clean outputs: the same arrays make the same rows."""

    def __init__(self, clean_rows, cache: _PerturbationScopedProgramCache):
        self._rows: dict[tuple[str, str, str, str], list[dict]] = {}
        for row in clean_rows:
            key = (row["case"], row["candidate"], row["comparison"], row["partner"])
            self._rows.setdefault(key, []).append(row)
        self._cache = cache

    def __call__(self, case, candidate, comparison: str, partner):
        if not self._cache.recorded(candidate, case) or (
            partner is not None and not self._cache.recorded(partner, case)
        ):
            return None
        partner_name = ORACLE_PATH if partner is None else partner.name
        return self._rows.get((case.name, candidate.name, comparison, partner_name))


class SharedInputs:
    """Fixtures, float64 oracle results and the causes' hypotheses, computed once per case for every pass:
    none depends on a seam. The hypotheses keep the latest case's only (up to a few GB each)."""

    def __init__(self, oracle_cache: OracleCache | None = None, fits: FitStore | None = None):
        self._fixtures: dict = {}
        self._oracles: dict = {}
        self._oracle_cache = oracle_cache if oracle_cache is not None else OracleCache()
        self.hypotheses = HypothesisOracle(fits=fits)

    def fixture(self, case):
        if case not in self._fixtures:
            self._fixtures[case] = make_fixture(case)
        return self._fixtures[case]

    def oracle(self, case, fixture):
        if case not in self._oracles:
            self._oracles[case] = self._oracle_cache(case, fixture)
        return self._oracles[case]


def _runner(policy, shared: SharedInputs, cache: RunOnlyPrograms, recorded_rows=no_recorded_rows) -> Runner:
    return Runner(
        policy,
        Collaborators(
            fixture_loader=shared.fixture,
            oracle=OracleFunction(shared.oracle),
            programs=cache,
            hypotheses=shared.hypotheses,
            recorded_rows=recorded_rows,
        ),
    )


def clean_rows_of(case, policy, shared: SharedInputs, memo: dict, impls, programs: ProgramCache | None = None):
    """Rows of the unmodified code on `case`, every path's outputs recorded in `memo`; programs: the clean
    programs' cache (default: a fresh one, no store)."""
    return list(_runner(policy, shared, _RecordingProgramCache(memo, programs)).run_case(case, _plan(impls)))


def perturbed_rows_of(
    perturbation: Perturbation, cases, policy, shared: SharedInputs, memo: dict, impls, clean_rows=None
):
    """Rows of `cases` with `perturbation` injected: affected paths traced afresh, the others from `memo`.
    clean_rows: the clean pass's rows, reused where the perturbation cannot change them (None: every
    comparison is made again)."""
    rows: list[dict] = []
    with perturbation.injected():
        cache = _PerturbationScopedProgramCache(memo, perturbation)
        recorded = no_recorded_rows if clean_rows is None else _CleanComparisons(clean_rows, cache)
        runner = _runner(policy, shared, cache, recorded)
        for case in cases:
            rows.extend(runner.run_case(case, _plan(impls)))
    jax.clear_caches()
    return rows


def run_clean_pass(cases, policy, shared: SharedInputs, memo: dict, impls) -> list[dict]:
    programs = ProgramCache()
    return [row for case in cases for row in clean_rows_of(case, policy, shared, memo, impls, programs)]


@dataclasses.dataclass(frozen=True)
class CasePasses:
    """One case's rows in the kill matrix: perturbed holds (name, rows, seconds) per perturbation run, in
    the order asked; seconds: the whole case, clean pass included."""

    case: str
    clean_rows: tuple[dict, ...]
    perturbed: tuple[tuple[str, tuple[dict, ...], float], ...]
    seconds: float

    def rows_of(self, name: str) -> tuple[dict, ...]:
        """The rows under perturbation `name`; KeyError if it did not run on the case."""
        return self._entry(name)[1]

    def seconds_of(self, name: str) -> float:
        return self._entry(name)[2]

    def _entry(self, name: str) -> tuple[str, tuple[dict, ...], float]:
        for entry in self.perturbed:
            if entry[0] == name:
                return entry
        raise KeyError(f"{name} did not run on {self.case}")


class CaseRunner:
    """Runs cases' passes in one process, keeping what outlives a case: the clean programs (in memory and
    the program store), the oracle cache and the fits' store."""

    def __init__(self, policy, impls):
        self.policy = policy
        self.impls = tuple(impls)
        self.clean_programs = ProgramCache(store=ProgramStore())
        self.oracle_cache = OracleCache()
        self.fits = FitStore()

    def run(self, case, perturbations: Sequence[Perturbation]) -> CasePasses:
        start = time.perf_counter()
        shared, memo = SharedInputs(self.oracle_cache, self.fits), {}
        clean = clean_rows_of(case, self.policy, shared, memo, self.impls, self.clean_programs)
        perturbed = []
        for perturbation in perturbations:
            begun = time.perf_counter()
            rows = perturbed_rows_of(perturbation, [case], self.policy, shared, memo, self.impls, clean)
            perturbed.append((perturbation.name, tuple(rows), time.perf_counter() - begun))
        return CasePasses(case.name, tuple(clean), tuple(perturbed), time.perf_counter() - start)
