"""The checks every implementation of the mHC layer must pass, written once.

A subclass of `ImplementationChecks` names one implementation and inherits every check
(tests/test_implementations.py holds one per implementation)::

    class TestMyKernel(ImplementationChecks):
        implementation = load_external("my_package.module:factory")

Each check runs the implementation in the layer, forward and VJP, exactly as
`mhc-parity run` does (`mhc_parity.harness.engine.runner.Runner`), on a few small cases: float32 with a
parameterised branch, bfloat16, and float32 token-sharded over the 8 host devices. Its
leaves are judged against the float64 oracle and, for every implementation but the
reference itself, against the reference path, token-sharded against unsharded; every
bound comes from the tolerance policy (mhc_parity/harness/judging/tolerances.toml, docs/tolerances.md):
nothing here has a tolerance of its own. A failure prints the rows that failed.

The run of one (implementation, case) is computed once per process, and pytest-xdist's
`--dist loadscope` (pyproject.toml) sends all of a class's checks to one worker.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import pytest

from mhc_parity.cases.catalogue import make_case
from mhc_parity.harness.engine.implementations import REFERENCE, Implementation
from mhc_parity.harness.engine.leaves import INTERMEDIATE_LEAVES
from mhc_parity.harness.engine.paths import ORACLE_PATH
from mhc_parity.harness.engine.plan import PathPlan, planned_leaves
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.reports.terminal import rows_table

# Small cases, one per kind of check: float32 with a branch that has parameters (and
# gradients), bfloat16, and float32 token-sharded 2x4 with 8 tokens per shard.
CASES = (
    make_case(batch=2, sequence=32, dtype="float32", branch="mlp"),
    make_case(batch=2, sequence=32, dtype="bfloat16"),
    make_case(batch=2, sequence=32, dtype="float32", mesh=(2, 4), block_tokens=8),
)
# `make test-fast` runs the first case (the smoke matrix covers bfloat16 and sharding
# through the same policy); `make test` runs all three.
CASE_PARAMS = (CASES[0], *(pytest.param(case, marks=pytest.mark.slow) for case in CASES[1:]))


@functools.cache
def _runner() -> Runner:
    return Runner(load_policy())


@functools.cache
def implementation_rows(implementation: Implementation, case) -> tuple[dict, ...]:
    """Every row of `case` whose candidate is `implementation` (its paths next to the reference's)."""
    implementations = (REFERENCE,) if implementation.name == REFERENCE.name else (REFERENCE, implementation)
    rows = _runner().run_case(case, PathPlan(implementations=implementations, lowering=False))
    return tuple(r for r in rows if r["candidate"].split("/", 1)[0] == implementation.name)


@functools.cache
def judged_rows(implementation: Implementation, case) -> tuple[dict, ...]:
    """`implementation_rows` without the failing rows' causes searched: the same rows, bounds and
    verdicts (each failing row says its causes were not searched), for a test that reads those only.
    The search runs the hypotheses' programs of every failing leaf: most of a failing run's time."""
    implementations = (REFERENCE,) if implementation.name == REFERENCE.name else (REFERENCE, implementation)
    rows = _runner().run_case(case, PathPlan(implementations=implementations, lowering=False, causes=False))
    return tuple(r for r in rows if r["candidate"].split("/", 1)[0] == implementation.name)


def check_rows(rows, *, leaf, comparisons) -> None:
    """Every row of the `comparisons` on leaves where `leaf(name)` holds passed, and each
    comparison judged at least one such leaf; skips (with the reason) when the
    implementation did not run the case at all, fails with the table of bad rows otherwise."""
    selected = [r for r in rows if r["comparison"] in comparisons and (r["leaf"] == "*" or leaf(r["leaf"]))]
    if selected and all(r["verdict"] == "skip" for r in selected):
        pytest.skip("; ".join(sorted({r["reason"] for r in selected}))[:300])
    bad = [r for r in selected if r["verdict"] != "pass"]
    if bad:
        pytest.fail(f"{len(bad)} of {len(selected)} rows did not pass:\n{rows_table(bad, limit=None)}", pytrace=False)
    unjudged = [c for c in comparisons if not any(r["comparison"] == c for r in selected)]
    if unjudged:
        pytest.fail(f"no leaf was judged by {', '.join(unjudged)}", pytrace=False)


class ImplementationChecks:
    """The forward, intermediate and VJP checks of one implementation (module docstring)."""

    implementation: ClassVar[Implementation]

    @pytest.fixture(params=CASE_PARAMS, ids=lambda case: case.name)
    def case(self, request):
        return request.param

    @pytest.fixture
    def rows(self, case):
        return implementation_rows(self.implementation, case)

    @property
    def partners(self) -> tuple[str, ...]:
        """The comparisons every leaf is judged by: the oracle, and the reference unless it is one."""
        return ("vs_oracle",) if self.implementation.name == REFERENCE.name else ("vs_oracle", "vs_reference")

    def test_forward_output(self, rows):
        check_rows(rows, leaf=lambda name: name == "out", comparisons=self.partners)

    def test_intermediates_it_exposes(self, rows):
        """layer_input always; h_pre, h_post and h_res where the implementation's context has them."""
        check_rows(rows, leaf=lambda name: name in INTERMEDIATE_LEAVES, comparisons=self.partners)
        assert any(r["leaf"] == "layer_input" for r in rows)

    def test_vjp_activation_gradient(self, rows):
        check_rows(rows, leaf=lambda name: name == "d_x", comparisons=self.partners)

    def test_vjp_weight_gradients(self, rows, case):
        weights = {
            name
            for name in planned_leaves(case)
            if name.startswith("d_") and not name.startswith("d_branch.") and name != "d_x"
        }
        check_rows(rows, leaf=lambda name: name in weights, comparisons=self.partners)
        assert weights <= {r["leaf"] for r in rows}, "a weight gradient is missing"

    def test_vjp_branch_gradients(self, rows, case):
        if not any(name.startswith("d_branch.") for name in planned_leaves(case)):
            pytest.skip(f"the {case.branch} branch has no parameters")
        check_rows(rows, leaf=lambda name: name.startswith("d_branch."), comparisons=self.partners)

    def test_token_sharded_matches_unsharded(self, rows, case):
        if case.mesh is None:
            pytest.skip("an unsharded case")
        check_rows(rows, leaf=lambda name: True, comparisons=("vs_unsharded",))

    def test_leaf_dtypes_follow_the_layer_contract(self, rows, case):
        """out, layer_input and d_x in the activation dtype, h_* in float32, gradients in their primal's dtype."""
        expected = planned_leaves(case)
        measured = {(r["leaf"], r["dtype"]) for r in rows if r["partner"] == ORACLE_PATH and r["leaf"] in expected}
        if not measured:
            pytest.skip("no leaf was measured")
        assert {leaf: dtype for leaf, dtype in measured} == {leaf: expected[leaf] for leaf, _ in measured}
