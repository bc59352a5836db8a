"""The false-positive sweep: the unmodified code over many seeds must never fail a row.

`run_sweep(cases, seeds, ...)` runs every case at seeds 0..seeds-1 (renamed
``<case>-seed<s>``) through every built-in path (and any --impl), and reports per
(comparison, dtype, leaf kind) the passing and failing rows and how close the passing
ones came to their bounds (`reports.sweep.headroom_table`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from harness.engine.plan import PathPlan
from harness.engine.runner import Runner
from harness.faults.matrix import log
from records.kill_records import CATCHING_VERDICTS


def seeded_cases(cases: Sequence, seeds: int) -> list:
    """Every case at seeds 0..seeds-1, named `<case>-seed<s>` (seed-major order)."""
    return [case.replace(name=f"{case.name}-seed{s}", seed=s) for s in range(seeds) for case in cases]


def run_sweep_rows(cases: Sequence, seeds: int, policy, impls, *, quiet=False) -> list[dict]:
    """Rows of the unmodified code over the seeded cases (lowering rows excluded)."""
    seeded = seeded_cases(cases, seeds)
    runner = Runner(policy)
    plan = PathPlan(implementations=tuple(impls), lowering=False)
    rows: list[dict] = []
    for index, case in enumerate(seeded, 1):
        start = time.perf_counter()
        case_rows = list(runner.run_case(case, plan))
        rows.extend(case_rows)
        bad = sum(r["verdict"] in CATCHING_VERDICTS for r in case_rows)
        log(
            f"  sweep [{index}/{len(seeded)}] {case.name} ({time.perf_counter() - start:.1f}s"
            f"{f', {bad} FAILING row(s)' if bad else ''})",
            quiet=quiet,
        )
    return rows
