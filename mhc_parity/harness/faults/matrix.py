"""The kill matrix: every fault and legitimate variant injected in turn, judged per dtype slice.

1. A clean pass runs the selected cases through every path of the unmodified code —
   the built-in implementations, the independent external implementation
   (`mhc_parity.harness.faults.independent_mhc`) and any `--impl` — lowering rows excluded (no
   perturbation touches them). Its rows are the reference verdicts; every path's outputs
   are kept in memory. A clean row that fails is a false positive of the rules.
2. For each perturbation: inject it, then, with a fresh program cache (JAX caches are
   cleared by the injection), run the cases it can affect. Paths it cannot change are
   not re-run: their clean outputs are reused, and so are fixtures and float64 oracle
   results (no perturbation touches `mhc_parity/cases/` or the oracle).
3. A row *catches* the perturbation when its verdict is fail or error under it while the
   same row (case, candidate, partner, leaf) did not fail in the clean pass. Catches are
   judged per dtype slice (the cases of one activation dtype alone): a fault must be
   caught in every slice it runs in, unless it names the slice in `unkillable_in`; a
   legitimate variant must be caught nowhere. For a slice where nothing catches, the
   closest row (largest bound_usage among the rows the perturbation moved) is reported,
   with its usage on clean code.

Each pass is single-threaded (XLA compilation dominates), so `run_kill_matrix(jobs=N)`
deals the perturbations to N spawned processes, each repeating the clean pass.
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import multiprocessing
import sys
import time
from collections.abc import Sequence

import jax

from mhc_parity.cases import registry
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.implementations import BUILTIN, load_external
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.run_info import enable_compilation_cache
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.env import ensure_host_devices, pace_garbage_collector
from mhc_parity.harness.faults import BY_NAME
from mhc_parity.harness.faults.model import Perturbation
from mhc_parity.harness.judging.policy import load_policy
from mhc_parity.harness.stores.oracle_cache import OracleCache
from mhc_parity.records.kill_records import (
    CATCHING_VERDICTS,
    DTYPE_SLICES,
    FAULT_COMPARISONS,
    Catch,
    Closest,
    KillMatrix,
    PerturbationResult,
    SliceVerdict,
    nan_low,
    usage_of,
)
from mhc_parity.records.schema import row_key

# The external implementation every kill matrix runs, so faults can be injected into
# code the harness knows only through the --impl interface.
INDEPENDENT_IMPL = "mhc_parity.harness.faults.independent_mhc:factory"


def log(message: str, *, quiet: bool = False) -> None:
    """A progress line on stderr."""
    if not quiet:
        print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ running


def implementations(extra_specs: Sequence[str] = ()) -> tuple:
    """The kill matrix's implementations: the built-ins, the independent one, then `extra_specs`.

    Raises `mhc_parity.harness.engine.implementations.ImplementationError` for a bad --impl spec.
    """
    externals = [load_external(spec) for spec in (INDEPENDENT_IMPL, *extra_specs)]
    return tuple(BUILTIN.values()) + tuple(externals)


def _plan(impls):
    return PathPlan(implementations=tuple(impls), lowering=False)


class _RecordingProgramCache:
    """A `ProgramCache` that remembers each (case, path)'s outputs — or exception — in `memo`."""

    def __init__(self, memo: dict):
        self._cache = ProgramCache()
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


class _PerturbationScopedProgramCache:
    """A fresh `ProgramCache` for the paths `perturbation` affects; recorded clean results for the rest."""

    def __init__(self, memo: dict, perturbation: Perturbation):
        self._cache = ProgramCache()
        self.memo = memo
        self.perturbation = perturbation

    def _recorded(self, path, case) -> bool:
        return not self.perturbation.affects_path(path) and (case.name, path.name) in self.memo

    def prepare(self, paths, case, fixture) -> None:
        self._cache.prepare([p for p in paths if not self._recorded(p, case)], case, fixture)

    def run(self, path, case, fixture):
        if self._recorded(path, case):
            recorded = self.memo[(case.name, path.name)]
            if isinstance(recorded, BaseException):
                raise recorded
            return recorded
        return self._cache.run(path, case, fixture)


class SharedInputs:
    """Fixtures and float64 oracle results, computed once per case for every pass.

    Neither depends on the paths (`mhc_parity/cases/` and the oracle import nothing a perturbation
    patches), so no perturbation can change them. The oracle comes from the disk cache
    (`mhc_parity.harness.stores.oracle_cache`) when an earlier run computed it.
    """

    def __init__(self):
        self._fixtures: dict = {}
        self._oracles: dict = {}
        self._oracle_cache = OracleCache()

    def fixture(self, case):
        if case not in self._fixtures:
            self._fixtures[case] = make_fixture(case)
        return self._fixtures[case]

    def oracle(self, case, fixture):
        if case not in self._oracles:
            self._oracles[case] = self._oracle_cache(case, fixture)
        return self._oracles[case]


def _runner(policy, shared: SharedInputs, cache):
    return Runner(policy, fixture_loader=shared.fixture, oracle=shared.oracle, cache=cache)


def run_clean_pass(cases, policy, shared: SharedInputs, memo: dict, impls, *, quiet=False) -> list[dict]:
    """Rows of the unmodified code over `cases`; every path's outputs recorded in `memo`."""
    runner = _runner(policy, shared, _RecordingProgramCache(memo))
    rows: list[dict] = []
    for index, case in enumerate(cases, 1):
        start = time.perf_counter()
        case_rows = list(runner.run_case(case, _plan(impls)))
        rows.extend(case_rows)
        bad = sum(r["verdict"] in CATCHING_VERDICTS for r in case_rows)
        note = f", {bad} FAILING row(s)" if bad else ""
        log(f"  clean [{index}/{len(cases)}] {case.name} ({time.perf_counter() - start:.1f}s{note})", quiet=quiet)
    return rows


def run_perturbation_pass(
    perturbation: Perturbation, cases, policy, shared: SharedInputs, memo: dict, impls
) -> list[dict]:
    """Rows of `cases` (those the perturbation can affect) with it injected."""
    rows: list[dict] = []
    with perturbation.injected():
        runner = _runner(policy, shared, _PerturbationScopedProgramCache(memo, perturbation))
        for case in cases:
            rows.extend(runner.run_case(case, _plan(impls)))
    jax.clear_caches()
    return rows


# ----------------------------------------------------------------------------- judging


def _catches(rows: Sequence[dict]) -> list[Catch]:
    grouped: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["comparison"], row["leaf"]), []).append(row)
    catches = []
    for (comparison, leaf), group in grouped.items():
        judged = [r for r in group if r["verdict"] == "fail"]
        finite = [u for u in map(usage_of, judged) if not math.isnan(u)]
        worst = max(judged, key=lambda r: nan_low(usage_of(r))) if judged else group[0]
        catches.append(
            Catch(
                comparison=comparison,
                leaf=leaf,
                leaf_kind=str(group[0].get("leaf_kind", "")),
                rows=len(group),
                cases=len({r["case"] for r in group}),
                errors=sum(r["verdict"] == "error" for r in group),
                max_bound_usage=max(finite) if finite else math.nan,
                worst_case=str(worst["case"]),
                worst_candidate=str(worst["candidate"]),
                worst_reason=str(worst.get("reason", ""))[:300],
            )
        )
    order = {c: i for i, c in enumerate(FAULT_COMPARISONS)}
    catches.sort(key=lambda c: (order.get(c.comparison, 99), -nan_low(c.max_bound_usage), c.leaf))
    return catches


def _top_cause(perturbation: Perturbation, rows: Sequence[dict]) -> dict:
    """The `SliceVerdict` cause fields of the catching rows: the cause most of them name."""
    named = collections.Counter((r["cause_id"], r["cause"]) for r in rows if r.get("cause_id"))
    if not named:
        return {}
    (cause_id, cause), count = named.most_common(1)[0]
    return {
        "top_cause": cause,
        "top_cause_id": cause_id,
        "top_cause_rows": count,
        "cause_rows": sum(named.values()),
        "own_cause": perturbation.names_its_cause(cause_id),
    }


def _closest(rows: Sequence[dict], clean_usage: dict) -> Closest | None:
    """The row with the largest bound_usage among those the perturbation moved (all rows
    if it moved none): how close it came to being caught, next to its clean usage."""
    measured = [r for r in rows if r["comparison"] in FAULT_COMPARISONS and not math.isnan(usage_of(r))]
    moved = [r for r in measured if usage_of(r) != clean_usage.get(row_key(r), math.nan)]
    candidates = moved or measured
    if not candidates:
        return None
    row = max(candidates, key=usage_of)
    return Closest(
        case=str(row["case"]),
        candidate=str(row["candidate"]),
        comparison=str(row["comparison"]),
        leaf=str(row["leaf"]),
        bound=str(row.get("bound", "")),
        usage=usage_of(row),
        clean_usage=clean_usage.get(row_key(row), math.nan),
    )


def judge(
    perturbation: Perturbation, rows: Sequence[dict], clean_rows: Sequence[dict], cases_run: Sequence, seconds: float
) -> PerturbationResult:
    """Which rows caught `perturbation`, per dtype slice (see the module docstring).

    rows: the rows under the perturbation; clean_rows: the clean pass's; cases_run: the
    `Case`s the perturbation ran on.
    """
    clean_verdict = {row_key(r): r["verdict"] for r in clean_rows}
    clean_usage = {row_key(r): usage_of(r) for r in clean_rows}
    slices, ignored = [], 0
    for dtype_slice in DTYPE_SLICES:
        names = tuple(c.name for c in cases_run if c.dtype == dtype_slice)
        in_slice = [r for r in rows if r["case"] in set(names)]
        catching, quiet = [], []
        for row in in_slice:
            if clean_verdict.get(row_key(row)) in CATCHING_VERDICTS:
                ignored += row["verdict"] in CATCHING_VERDICTS
                continue
            (catching if row["verdict"] in CATCHING_VERDICTS else quiet).append(row)
        caught_cases = {r["case"] for r in catching}
        slices.append(
            SliceVerdict(
                dtype_slice=dtype_slice,
                legitimate=perturbation.legitimate,
                cases_run=names,
                cases_caught=tuple(n for n in names if n in caught_cases),
                catches=tuple(_catches(catching)),
                closest=_closest(quiet, clean_usage),
                unkillable_reason=perturbation.unkillable_reason(dtype_slice),
                **_top_cause(perturbation, catching),
            )
        )
    return PerturbationResult(
        name=perturbation.name,
        seams=perturbation.seam_names,
        description=perturbation.description,
        legitimate=perturbation.legitimate,
        slices=tuple(slices),
        ignored_clean_failures=ignored,
        seconds=seconds,
        causes=perturbation.causes,
    )


# ------------------------------------------------------------------------- whole runs


def run_in_process(perturbations: Sequence[Perturbation], cases, policy, impls, *, quiet=False) -> KillMatrix:
    """Clean pass, then one pass per perturbation, in this process."""
    shared, memo = SharedInputs(), {}
    log(f"faults: clean pass over {len(cases)} case(s)")
    clean_rows = run_clean_pass(cases, policy, shared, memo, impls, quiet=quiet)
    results, perturbed = [], []
    for perturbation in perturbations:
        targets = [c for c in cases if perturbation.affects_case(c, impls)]
        start = time.perf_counter()
        log(f"faults: {perturbation.name} on {len(targets)} case(s) ...")
        rows = run_perturbation_pass(perturbation, targets, policy, shared, memo, impls) if targets else []
        result = judge(perturbation, rows, clean_rows, targets, time.perf_counter() - start)
        results.append(result)
        perturbed.append((perturbation.name, tuple(rows)))
        cells = ", ".join(f"{s.dtype_slice}: {s.cell}" for s in result.slices if s.cases_run)
        log(f"faults: {perturbation.name}: {result.status} [{cells}] ({result.seconds:.0f}s)")
    return KillMatrix(tuple(clean_rows), tuple(results), tuple(perturbed))


def _worker(
    names: Sequence[str],
    case_names: Sequence[str],
    policy_path,
    impl_specs: Sequence[str],
    quiet: bool,
    use_compilation_cache: bool,
) -> KillMatrix:
    """One worker process (an entry point): catalogued perturbations by name, registry cases by name."""
    ensure_host_devices()
    pace_garbage_collector()
    if use_compilation_cache:
        enable_compilation_cache()
    cases = [registry.default_registry().get(name) for name in case_names]
    return run_in_process(
        [BY_NAME[n] for n in names], cases, load_policy(policy_path), implementations(impl_specs), quiet=quiet
    )


def _deal(perturbations: Sequence[Perturbation], jobs: int) -> list[list[Perturbation]]:
    """Perturbations dealt round-robin into `jobs` groups (kernel ones cost more; dealing mixes them)."""
    ordered = sorted(perturbations, key=lambda p: (p.implementations == ("reference",), p.sharded_only))
    groups: list[list[Perturbation]] = [[] for _ in range(min(jobs, len(ordered)))]
    for index, perturbation in enumerate(ordered):
        groups[index % len(groups)].append(perturbation)
    return groups


def run_in_workers(
    perturbations: Sequence[Perturbation],
    cases,
    policy_path,
    impl_specs: Sequence[str],
    jobs: int,
    *,
    quiet=False,
    use_compilation_cache=True,
) -> KillMatrix:
    """`run_in_process` split over `jobs` spawned processes (each does its own clean pass)."""
    groups = _deal(perturbations, jobs)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=len(groups), mp_context=context) as pool:
        futures = [
            pool.submit(
                _worker,
                [p.name for p in group],
                [c.name for c in cases],
                policy_path,
                tuple(impl_specs),
                quiet,
                use_compilation_cache,
            )
            for group in groups
        ]
        outcomes = [future.result() for future in futures]
    results = {r.name: r for outcome in outcomes for r in outcome.results}
    rows = {name: rows for outcome in outcomes for name, rows in outcome.perturbed_rows}
    return KillMatrix(
        clean_rows=outcomes[0].clean_rows,
        results=tuple(results[p.name] for p in perturbations),
        perturbed_rows=tuple((p.name, rows[p.name]) for p in perturbations),
    )
