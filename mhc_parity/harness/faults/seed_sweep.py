"""The false-positive sweep: the unmodified code over many seeds must never fail a row.

`run_sweep_rows` runs every case at each seed (``<case>-seed<s>``) through every built-in path and any
--impl; `mhc_parity.reports.sweep` tables the headroom. A case's seeds run one after the other
(`case_major`: they share programs; docs/speed.md), one case at a time (with answers ahead, two of the
largest float64 oracles would be held at once); rows come back in seed-major order.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from collections.abc import Sequence

from mhc_parity.cases import registry
from mhc_parity.harness.engine.implementations import BUILTIN, load_external
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.run_info import enable_compilation_cache
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.env import ensure_host_devices, pace_garbage_collector
from mhc_parity.harness.faults.matrix import log
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records.kill_records import CATCHING_VERDICTS


def _seed_values(seeds: int | Sequence[int]) -> Sequence[int]:
    return range(seeds) if isinstance(seeds, int) else seeds


def _seeded(case, seed: int):
    return case.replace(name=f"{case.name}-seed{seed}", seed=seed)


def seeded_cases(cases: Sequence, seeds: int | Sequence[int]) -> list:
    """Every case at seeds 0..seeds-1 (or those listed), named `<case>-seed<s>`, seed-major."""
    return [_seeded(case, s) for s in _seed_values(seeds) for case in cases]


def case_major(cases: Sequence, seeds: int | Sequence[int]) -> list:
    """`seeded_cases` with each case's seeds together: the order the sweep runs them in."""
    return [_seeded(case, s) for case in cases for s in _seed_values(seeds)]


def run_sweep_rows(cases: Sequence, seeds: int | Sequence[int], policy, impls, *, quiet=False) -> list[dict]:
    """Rows of the unmodified code over the seeded cases (no lowering rows), in `seeded_cases`' order."""
    seeded = seeded_cases(cases, seeds)
    runner = Runner.with_disk_stores(policy)
    plan = PathPlan(implementations=tuple(impls), lowering=False)
    by_name: dict[str, list[dict]] = {}
    for index, case in enumerate(case_major(cases, seeds), 1):
        start = time.perf_counter()
        by_name[case.name] = case_rows = list(runner.run_case(case, plan))
        bad = sum(r["verdict"] in CATCHING_VERDICTS for r in case_rows)
        log(
            f"  sweep [{index}/{len(seeded)}] {case.name} ({time.perf_counter() - start:.1f}s"
            f"{f', {bad} FAILING row(s)' if bad else ''})",
            quiet=quiet,
        )
    return [row for case in seeded for row in by_name[case.name]]


def sweep_implementations(impl_specs: Sequence[str] = ()) -> tuple:
    """The built-ins and any --impl (not the kill matrix's independent one, which is evidence, not code
    under test)."""
    return tuple(BUILTIN.values()) + tuple(load_external(spec) for spec in impl_specs)


def _sweep_worker(seeds: Sequence[int], case_names: Sequence[str], policy_path, impl_specs: Sequence[str], quiet):
    """One worker process (an entry point): the sweep's rows at `seeds`, cases by name."""
    ensure_host_devices()
    pace_garbage_collector()
    enable_compilation_cache()
    cases = [registry.default_registry().get(name) for name in case_names]
    return run_sweep_rows(cases, seeds, load_policy(policy_path), sweep_implementations(impl_specs), quiet=quiet)


def run_sweep_in_workers(
    cases: Sequence, seeds: int, policy_path, impl_specs: Sequence[str], jobs: int, *, quiet=False
) -> list[dict]:
    """`run_sweep_rows` with seeds dealt round-robin to `jobs` spawned processes; rows in one process's
    order."""
    groups = [list(range(seeds))[start::jobs] for start in range(min(jobs, seeds))]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=len(groups), mp_context=context) as pool:
        futures = [
            pool.submit(_sweep_worker, group, [c.name for c in cases], policy_path, tuple(impl_specs), quiet)
            for group in groups
        ]
        by_seed: dict[int, list[dict]] = {}
        for group, future in zip(groups, futures):
            rows = future.result()
            for seed in group:
                suffix = f"-seed{seed}"
                by_seed[seed] = [r for r in rows if str(r["case"]).endswith(suffix)]
    return [row for seed in range(seeds) for row in by_seed[seed]]
