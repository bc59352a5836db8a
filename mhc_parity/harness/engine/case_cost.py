"""A case's relative cost, so that worker processes are dealt the costliest cases first.

A pool of workers takes cases in the order they are submitted: a costly case submitted last
keeps one worker busy while the others, done, wait. `mhc-parity run --jobs N`
(`mhc_parity.harness.processes.parallel`) and the kill matrix (`mhc_parity.harness.faults.matrix`)
therefore submit the costliest first. Only the order matters: a case's rows do not depend on
which worker runs it or when, and both yield the rows in the selection's order.
"""

from __future__ import annotations

from collections.abc import Iterable

from mhc_parity.cases.fixtures import fixture_elements

# The weights, fitted to the default suite's seconds per case on a 2-core machine (the kill
# matrix's passes): the fixture elements a pass costs besides its size (tracing and compiling
# its paths, the fixed part of the causes' fits), how much more a case with a mesh costs (its
# sharded paths), and a variant's factor (Sinkhorn's iterations make each of its oracle runs,
# hypotheses and fits costlier than mHC-lite's).
PASS_OVERHEAD_ELEMENTS = 300_000
SHARDED_FACTOR = 1.5
VARIANT_FACTORS = {"sinkhorn": 2.5}


def pass_cost(case) -> float:
    """The relative cost of one pass over `case` (a `mhc_parity.cases.spec.Case`): its paths,
    oracle and comparisons, by its size, mesh and variant."""
    size = fixture_elements(case) + PASS_OVERHEAD_ELEMENTS
    return size * (SHARDED_FACTOR if case.mesh is not None else 1.0) * VARIANT_FACTORS.get(case.variant, 1.0)


def costliest_first(cases: Iterable, cost=pass_cost) -> list:
    """`cases` sorted by `cost(case)`, the costliest first; equal costs keep their order."""
    return sorted(cases, key=lambda case: -cost(case))
