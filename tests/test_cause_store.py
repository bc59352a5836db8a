"""The cause store (mhc_parity.harness.engine.cause_store): a case's failing rows' causes and an
implementation's declared effects, computed once and loaded by the next run with the same rows;
any change of what they are computed from misses, and the declared sources cover every project
file computing them runs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine import cause_store
from mhc_parity.harness.engine.cause_store import CauseStore
from mhc_parity.harness.engine.causes import HypothesisOracle, annotate_causes
from mhc_parity.harness.engine.collaborators import Collaborators
from mhc_parity.harness.engine.implementations import REFERENCE, load_external
from mhc_parity.harness.engine.oracle_cache import OracleCache
from mhc_parity.harness.engine.oracle_path import OracleOutputs
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.precision_choices import DeclaredEffects, measured_effects
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.harness.judging.policy_file import load_policy
from tests.cli_support import without_timing
from tests.implementation_base import CASES
from tests.support import project_files_run

CASE = CASES[0]  # float32: the declared bfloat16 post gate moves leaves, the drift on top fails
ORACLE = OracleOutputs(
    leaves={"out": np.arange(4.0)},
    sensitivity={"out": Sensitivity(1e-3, 1e-4, 1e-6, 12.0, 300.0, 16)},
    execute_s=0.0,
    systematic={"out": 0.5},
)
FAILING = {"candidate": "mine/unsharded", "leaf": "out", "verdict": "fail", "cause": "", "compile_s": 1.0}


def _causes(store, rows, leaves, calls):
    def compute():
        calls.append(1)
        return [{**row, "cause": "because", "cause_id": "why", "cause_explained": 0.75} for row in rows]

    fixture = make_fixture(CASE)
    return store.causes(rows, CASE, fixture, ORACLE, {"mine/unsharded": leaves}, {}, compute)


def test_stored_causes_are_loaded_and_a_change_of_a_leaf_or_a_row_misses(tmp_path):
    calls, leaves = [], {"out": np.arange(4.0) + 1}
    first = _causes(CauseStore(tmp_path), [FAILING], leaves, calls)
    again = _causes(CauseStore(tmp_path), [{**FAILING, "compile_s": 2.0}], leaves, calls)  # timing aside
    assert len(calls) == 1 and again[0]["cause"] == first[0]["cause"] == "because"
    assert again[0]["cause_explained"] == 0.75 and again[0]["compile_s"] == 2.0
    _causes(CauseStore(tmp_path), [FAILING], {"out": np.arange(4.0) + 1 + 2**-40}, calls)
    assert len(calls) == 2, "a candidate's leaf changed by one bit"
    _causes(CauseStore(tmp_path), [{**FAILING, "bound_usage": 3.0}], leaves, calls)
    assert len(calls) == 3, "a row changed"
    passing = {**FAILING, "verdict": "pass"}
    store = CauseStore(tmp_path)
    assert _causes(store, [passing], leaves, calls)[0]["cause"] == "because" and len(calls) == 4
    assert (store.store.hits, store.store.misses) == (0, 0), "a case with no failing row is not looked up"


def test_stored_declared_effects_are_the_computed_ones(tmp_path):
    effects = DeclaredEffects(rms={"d_x": 0.25}, max={"d_x": 0.5}, gain={"d_x": 1e-3}, systematic={"d_x": 2.0})
    choices = load_external("tests.external_impls:declares_post_gate_in_bfloat16").precision_choices
    fixture = make_fixture(CASE)
    assert CauseStore(tmp_path).declared_effects(choices, CASE, fixture, ORACLE, lambda: effects) == effects
    loaded = CauseStore(tmp_path).declared_effects(choices, CASE, fixture, ORACLE, lambda: pytest.fail("computed"))
    assert loaded == effects
    computed = DeclaredEffects()
    assert CauseStore(tmp_path).declared_effects(choices[:1], CASE, fixture, ORACLE, lambda: computed) is computed
    other = dataclasses.replace(CASE, seed=CASE.seed + 1)
    assert CauseStore(tmp_path).declared_effects(choices, other, fixture, ORACLE, lambda: computed) is computed


def _runner(tmp_path) -> Runner:
    return Runner(
        load_policy(),
        Collaborators(oracle=OracleCache(tmp_path / "oracle"), cause_store=CauseStore(tmp_path / "causes")),
    )


@pytest.mark.slow
def test_a_run_with_a_declared_choice_and_a_failing_row_loads_both_the_second_time(tmp_path, monkeypatch):
    impl = load_external("tests.external_impls:declared_choice_and_drift")
    plan = PathPlan(implementations=(REFERENCE, impl), lowering=False)
    first_runner = _runner(tmp_path)
    first = list(first_runner.run_case(CASE, plan))
    assert any(r["verdict"] == "fail" and r["cause"] for r in first), "a failing row with a cause"
    assert first_runner.collaborators.cause_store.counts() == {"causes_stored_loaded": 0, "causes_stored_missed": 2}

    def no_hypotheses(self, case, fixture):
        raise AssertionError("the stored answers should have been used")

    monkeypatch.setattr(HypothesisOracle, "_answer", no_hypotheses)
    second_runner = _runner(tmp_path)
    second = list(second_runner.run_case(CASE, plan))
    assert second_runner.collaborators.cause_store.counts() == {"causes_stored_loaded": 2, "causes_stored_missed": 0}
    assert _text(second) == _text(first)


def _text(rows) -> str:
    """Rows as JSON text, timing aside: NaN equals NaN there (two NaN objects compare unequal)."""
    return json.dumps(without_timing(rows), default=str)


@pytest.mark.slow
def test_the_sources_cover_every_file_naming_causes_and_measuring_effects_runs(tmp_path):
    """Computing a case's declared effects and its failing rows' causes runs project code only
    from `cause_sources()` (and the case's spec, which is key material)."""
    impl = load_external("tests.external_impls:declared_choice_and_drift")
    plan = PathPlan(implementations=(REFERENCE, impl), lowering=False)
    runner = _runner(tmp_path)
    fixture = make_fixture(CASE)
    oracle = runner.collaborators.oracle(CASE, fixture)
    paths = plan.paths_for(CASE)
    results = runner._run_paths(CASE, paths, fixture, lambda case, step: None)
    ran_leaves = {name: r.outputs.leaves for name, r in results.items() if r.outputs is not None}
    effects = measured_effects(impl.precision_choices, CASE, fixture, oracle.leaves, runner.collaborators.hypotheses)
    declared = {p.name: effects if p.impl is impl else DeclaredEffects() for p in paths}
    rows = list(runner.judge.compared_rows(CASE, paths, results, oracle, declared))
    widened = {name: e.widened(oracle.sensitivity) for name, e in declared.items() if e.rms}

    def judge():
        hypotheses = HypothesisOracle()  # computed anew, inside the profile
        measured_effects(impl.precision_choices, CASE, fixture, oracle.leaves, hypotheses)
        return annotate_causes(
            rows,
            CASE,
            fixture,
            oracle_leaves=oracle.leaves,
            oracle_sensitivity=oracle.sensitivity,
            candidate_leaves=ran_leaves,
            hypotheses=hypotheses,
            candidate_sensitivity=widened,
        )

    ran = project_files_run(judge)
    assert "mhc_parity/harness/judging/attribution.py" in ran and "mhc_parity/mhc/oracle_roundings.py" in ran
    allowed = {"mhc_parity/cases/spec.py", "mhc_parity/harness/engine/run_info.py", "tests/test_cause_store.py"}
    sources = set(cause_store.cause_sources())
    assert ran - allowed <= sources, sorted(ran - allowed - sources)
