"""Judging a case: its paths' results (`path_results.PathResult`) into rows, one per leaf of

  every path                  vs the oracle         ("vs_oracle")
  every non-reference path    vs reference, same sharding ("vs_reference")
  every token-sharded path    vs itself unsharded   ("vs_unsharded")

with their bounds widened by each implementation's declared precision choices, their verdicts, and
the failing rows' causes; status rows for the paths that gave no outputs. From the comparison store
where it holds the same outputs judged under the same policy and code."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator, Sequence

from mhc_parity.cases.branches import get_branch
from mhc_parity.harness.engine.causes import annotate_causes, not_searched
from mhc_parity.harness.engine.collaborators import Collaborators
from mhc_parity.harness.engine.compare import compare_leaves, status_row
from mhc_parity.harness.engine.comparison_store import key_material, path_material
from mhc_parity.harness.engine.devices import runs_on_host
from mhc_parity.harness.engine.path_results import PathResult, environment_fields, status_rows
from mhc_parity.harness.engine.paths import ORACLE_PATH, Path
from mhc_parity.harness.engine.plan import comparisons_of, mosaic_xla_pair
from mhc_parity.harness.engine.precision_choices import DeclaredEffects, measured_effects
from mhc_parity.harness.judging.metrics import MetricsMemo
from mhc_parity.harness.judging.policy import Policy


def last_readers(paths: Sequence[Path]) -> dict[str, int]:
    """Path name -> the index in `paths` of the last path whose comparisons read its leaves (as
    candidate or partner; `comparisons_of`); the oracle's leaves are read by every path."""
    last = {}
    for index, path in enumerate(paths):
        last[path.name] = index
        for _, partner in comparisons_of(path, paths):
            if partner != ORACLE_PATH:
                last[partner] = index
    return last


@dataclasses.dataclass(frozen=True)
class CaseJudge:
    """Judges cases under `policy` with a runner's `collaborators` (hypotheses, cause and comparison
    stores, recorded rows), adding its seconds to `timings`' `effects_s`, `compare_s` and `causes_s`."""

    policy: Policy
    collaborators: Collaborators
    timings: dict[str, float]

    def rows(
        self, case, paths: Sequence[Path], results: dict[str, PathResult], fixture, oracle, causes: bool
    ) -> list[dict]:
        """The case's rows: loaded from the comparison store, else judged (`judged_rows`) and stored
        there where their causes were searched (rows without causes are no later run's)."""
        store = self.collaborators.comparison_store
        if store is None:
            return self.judged_rows(case, paths, results, fixture, oracle, causes)
        path_timings = {name: r.outputs.timing for name, r in results.items() if r.outputs is not None}
        material = self._comparison_key(case, fixture, paths, results)
        rows = store.load(material, path_timings)
        if rows is None:
            rows = self.judged_rows(case, paths, results, fixture, oracle, causes)
            if causes:
                store.save(material, rows, path_timings)
        return rows

    def _comparison_key(self, case, fixture, paths: Sequence[Path], results: dict[str, PathResult]) -> dict:
        """The key of the case's judged rows in the comparison store."""
        return key_material(
            case,
            fixture,
            self.policy.digest,
            [
                path_material(
                    path.name,
                    verdict=results[path.name].verdict,
                    reason=results[path.name].reason,
                    devices=environment_fields(case, path, results[path.name].placement)["devices"],
                    leaves=None if results[path.name].outputs is None else results[path.name].outputs.leaves,
                )
                for path in paths
            ],
        )

    def judged_rows(
        self, case, paths: Sequence[Path], results: dict[str, PathResult], fixture, oracle, causes: bool = True
    ) -> list:
        """The case's comparison and status rows, their bounds and verdicts, and the failing rows'
        causes (without `causes`, each failing row says they were not searched)."""
        hypotheses, cause_store = self.collaborators.hypotheses, self.collaborators.cause_store
        # Once per implementation: its sharded and unsharded paths make the same choices.
        implementations = {path.impl.name: path.impl for path in paths}
        start = time.perf_counter()
        effects = {name: self._effects_of(impl, case, fixture, oracle) for name, impl in implementations.items()}
        declared = {path.name: effects[path.impl.name] for path in paths}
        self.timings["effects_s"] += time.perf_counter() - start
        start = time.perf_counter()  # the metrics and bounds of every row: one core, a leaf at a time
        rows = list(self.compared_rows(case, paths, results, oracle, declared))
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
            hypotheses=hypotheses,
            candidate_sensitivity=widened,
            elsewhere={path.name for path in paths if path.name in ran and not runs_on_host(path)},
        )
        if not causes:
            rows = not_searched(rows, ran, oracle.leaves)
        elif cause_store is None:
            rows = annotate()
        else:
            rows = cause_store.causes(rows, case, fixture, oracle, ran, widened, annotate)
        self.timings["causes_s"] += time.perf_counter() - start
        return rows

    def _effects_of(self, impl, case, fixture, oracle) -> DeclaredEffects:
        """What the precision choices `impl` declares and this backend makes move, leaf by leaf
        (`mhc_parity.harness.engine.precision_choices.measured_effects`): its rows' bounds widen by
        them. From the cause store where the runner has one and `impl` declares choices."""
        hypotheses, cause_store = self.collaborators.hypotheses, self.collaborators.cause_store

        def measure():
            return measured_effects(impl.precision_choices, case, fixture, oracle.leaves, hypotheses)

        if cause_store is None or not impl.precision_choices:
            return measure()
        return cause_store.declared_effects(impl.precision_choices, case, fixture, oracle, measure)

    def compared_rows(
        self, case, paths: Sequence[Path], results: dict[str, PathResult], oracle, declared: dict
    ) -> Iterator[dict]:
        """Every path's rows of one case: its comparisons, or status rows where it did not run.
        declared: path name -> its `DeclaredEffects` (`_effects_of`)."""
        recorded_rows = self.collaborators.recorded_rows
        memo = MetricsMemo()  # the case's comparisons share arrays (the oracle's leaves above all)
        by_name = {path.name: path for path in paths}
        last_reader = last_readers(paths)
        for index, path in enumerate(paths):
            # Leaves no comparison from here on reads: the memo's float64 copies of them go, else
            # they are most of the case's memory (issue 55: 16 paths at 8192 tokens, 27 GB).
            done = (results[name].outputs for name, last in last_reader.items() if last == index - 1)
            memo.forget(leaf for outputs in done if outputs is not None for leaf in outputs.leaves.values())
            result = results[path.name]
            environment = environment_fields(case, path, result.placement)
            if result.outputs is None or result.verdict == "fail":
                yield from status_rows(case, path, paths, result)
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
                recorded = recorded_rows(case, path, comparison, partner_path)
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
