"""A case's relative cost, so that worker processes (`run --jobs N`, the kill matrix) are dealt the
costliest cases first: a costly case dealt last keeps one worker busy while the others wait.
Only the order changes, never a case's rows."""

from __future__ import annotations

from collections.abc import Iterable

from mhc_parity.cases.fixtures import fixture_elements

# Fitted to the default suite's seconds per case on a 2-core machine: a pass's fixed cost in fixture
# elements (tracing, compiling, the fits' fixed part), a mesh's sharded paths, Sinkhorn's iterations.
PASS_OVERHEAD_ELEMENTS = 300_000
SHARDED_FACTOR = 1.5
VARIANT_FACTORS = {"sinkhorn": 2.5}


def pass_cost(case) -> float:
    """The relative cost of one pass over `case`: its paths, oracle and comparisons."""
    size = fixture_elements(case) + PASS_OVERHEAD_ELEMENTS
    return size * (SHARDED_FACTOR if case.mesh is not None else 1.0) * VARIANT_FACTORS.get(case.variant, 1.0)


def costliest_first(cases: Iterable, cost=pass_cost) -> list:
    """`cases` sorted by `cost(case)`, the costliest first; equal costs keep their order."""
    return sorted(cases, key=lambda case: -cost(case))
