"""The kill matrix: every fault and legitimate variant injected in turn, judged per dtype slice.

A clean pass runs the cases through every path (the built-ins, `independent_mhc`, any `--impl`; no lowering
rows); a failing clean row is a false positive. A row *catches* a perturbation when it fails or errors under
it and did not fail clean. A fault must be caught in every dtype slice it runs in unless the catalogue lists
the slice (never counted as caught); a legitimate variant nowhere. Cases may be dealt to spawned workers
(`run_in_workers`); the matrix is assembled in the selection's order either way. docs/judging.md ("What the
harness is shown to catch").
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import multiprocessing
import sys
from collections.abc import Mapping, Sequence

from mhc_parity.cases import registry
from mhc_parity.harness.engine.case_cost import costliest_first, pass_cost
from mhc_parity.harness.engine.implementations import BUILTIN, load_external
from mhc_parity.harness.engine.run_info import enable_compilation_cache
from mhc_parity.harness.env import ensure_host_devices, pace_garbage_collector
from mhc_parity.harness.faults import BY_NAME
from mhc_parity.harness.faults.model import Perturbation
from mhc_parity.harness.faults.passes import CasePasses, CaseRunner
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records.cause_consistency import consistent_causes, hypothesis_names
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

# Run by every kill matrix: faults injected into code the harness knows only through --impl.
INDEPENDENT_IMPL = "mhc_parity.harness.faults.independent_mhc:factory"


def log(message: str, *, quiet: bool = False) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ running


def implementations(extra_specs: Sequence[str] = ()) -> tuple:
    """The built-ins, the independent one, then `extra_specs`; ImplementationError for a bad spec."""
    externals = [load_external(spec) for spec in (INDEPENDENT_IMPL, *extra_specs)]
    return tuple(BUILTIN.values()) + tuple(externals)


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
    """The `SliceVerdict` cause fields of the catching rows: the cause id most name, in the words most of
    its rows say."""
    named = collections.Counter(r["cause_id"] for r in rows if r.get("cause_id"))
    if not named:
        return {}
    cause_id, count = named.most_common(1)[0]
    cause = collections.Counter(r["cause"] for r in rows if r.get("cause_id") == cause_id).most_common(1)[0][0]
    own = {c: perturbation.names_its_cause(c) for c in named}
    return {
        "top_cause": cause,
        "top_cause_id": cause_id,
        "top_cause_rows": count,
        "cause_rows": sum(named.values()),
        "own_cause": own[cause_id],
        "own_cause_rows": sum(n for c, n in named.items() if own[c]),
        # A rounding named that is not the perturbation's own: a wrong place stated with confidence.
        "wrong_cause_rows": sum(n for c, n in named.items() if not own[c] and hypothesis_names(c)),
    }


def _closest(rows: Sequence[dict], clean_usage: dict) -> Closest | None:
    """The row with the largest bound_usage among those the perturbation moved (all if none): how close it
    came to being caught, beside its clean usage."""
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
    """Which rows caught `perturbation`, per dtype slice; cases_run: the `Case`s it ran on."""
    rows = consistent_causes(rows)
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
        listed_by, reason = perturbation.listing(dtype_slice, [r for r in clean_rows if r["case"] in set(names)])
        slices.append(
            SliceVerdict(
                dtype_slice=dtype_slice,
                legitimate=perturbation.legitimate,
                cases_run=names,
                cases_caught=tuple(n for n in names if n in caught_cases),
                catches=tuple(_catches(catching)),
                closest=_closest(quiet, clean_usage),
                unkillable_reason=reason,
                listed_by=listed_by,
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


def perturbations_by_case(perturbations: Sequence[Perturbation], cases, impls) -> dict[str, list[Perturbation]]:
    return {case.name: [p for p in perturbations if p.affects_case(case, impls)] for case in cases}


def estimated_cost(case, perturbation_count: int) -> float:
    """A case's relative cost, to deal the costliest first: (1 + perturbations) passes."""
    return (1 + perturbation_count) * pass_cost(case)


def _case_line(index: int, total: int, passes: CasePasses) -> str:
    bad = sum(r["verdict"] in CATCHING_VERDICTS for r in passes.clean_rows)
    note = f", {bad} FAILING clean row(s)" if bad else ""
    return (
        f"  [{index}/{total}] {passes.case}: clean pass and {len(passes.perturbed)} perturbation(s) "
        f"({passes.seconds:.1f}s{note})"
    )


def assemble(perturbations: Sequence[Perturbation], cases, impls, outcomes: Mapping[str, CasePasses]) -> KillMatrix:
    """The kill matrix from each case's `CasePasses`, in the selection's order, each perturbation judged."""
    clean_rows = tuple(row for case in cases for row in outcomes[case.name].clean_rows)
    results, perturbed = [], []
    for perturbation in perturbations:
        targets = [c for c in cases if perturbation.affects_case(c, impls)]
        rows = tuple(row for c in targets for row in outcomes[c.name].rows_of(perturbation.name))
        rows = tuple(consistent_causes(rows))
        seconds = sum(outcomes[c.name].seconds_of(perturbation.name) for c in targets)
        result = judge(perturbation, rows, clean_rows, targets, seconds)
        results.append(result)
        perturbed.append((perturbation.name, rows))
        cells = ", ".join(f"{s.dtype_slice}: {s.cell}" for s in result.slices if s.cases_run)
        log(f"faults: {perturbation.name}: {result.status} [{cells}] ({result.seconds:.0f}s)")
    return KillMatrix(clean_rows, tuple(results), tuple(perturbed))


def run_in_process(perturbations: Sequence[Perturbation], cases, policy, impls, *, quiet=False) -> KillMatrix:
    by_case = perturbations_by_case(perturbations, cases, impls)
    log(f"faults: {len(cases)} case(s), {len(perturbations)} perturbation(s), case by case")
    runner, outcomes = CaseRunner(policy, impls), {}
    for index, case in enumerate(cases, 1):
        outcomes[case.name] = runner.run(case, by_case[case.name])
        log(_case_line(index, len(cases), outcomes[case.name]), quiet=quiet)
    return assemble(perturbations, cases, impls, outcomes)


# A worker process's `CaseRunner`, kept across the cases it is dealt.
_worker_runner: CaseRunner | None = None


def _start_worker(policy_path, impl_specs: Sequence[str], use_compilation_cache: bool) -> None:
    global _worker_runner
    ensure_host_devices()
    pace_garbage_collector()
    if use_compilation_cache:
        enable_compilation_cache()
    _worker_runner = CaseRunner(load_policy(policy_path), implementations(impl_specs))


def _run_case(case_name: str, names: Sequence[str]) -> CasePasses:
    """One case's passes in a worker (an entry point), case and perturbations by name."""
    return _worker_runner.run(registry.default_registry().get(case_name), [BY_NAME[n] for n in names])


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
    """`run_in_process` with the cases dealt to `jobs` spawned processes, the costliest first."""
    impls = implementations(impl_specs)
    by_case = perturbations_by_case(perturbations, cases, impls)
    order = costliest_first(cases, lambda c: estimated_cost(c, len(by_case[c.name])))
    log(f"faults: {len(cases)} case(s), {len(perturbations)} perturbation(s), dealt to {jobs} processes")
    context = multiprocessing.get_context("spawn")
    outcomes: dict[str, CasePasses] = {}
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=min(jobs, len(cases)),
        mp_context=context,
        initializer=_start_worker,
        initargs=(policy_path, tuple(impl_specs), use_compilation_cache),
    ) as pool:
        futures = [pool.submit(_run_case, case.name, [p.name for p in by_case[case.name]]) for case in order]
        for index, future in enumerate(concurrent.futures.as_completed(futures), 1):
            passes = future.result()
            outcomes[passes.case] = passes
            log(_case_line(index, len(cases), passes), quiet=quiet)
    return assemble(perturbations, cases, impls, outcomes)
