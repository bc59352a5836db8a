"""Interpret mode at real sizes (issue 55): run where affordable, otherwise a skip row that gives
the reason and the time it would take."""

import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine import interpret_cost
from mhc_parity.harness.engine.collaborators import Collaborators
from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
from mhc_parity.harness.engine.interpret_cost import interpret_estimate_s, interpret_refusal
from mhc_parity.harness.engine.oracle_cache import OracleCache
from mhc_parity.harness.engine.paths import Path
from mhc_parity.harness.engine.runner import PathPlan, Runner
from mhc_parity.harness.judging.policy_file import load_policy

MESHED = "lite-n4-c1024-b8s1024-bf16-w32-mlp-default-m2x4"
SMALL = Case(name="interpret-cost-small", batch=1, sequence=32, streams=2, embedding=128)


def test_an_interpret_path_over_its_budget_is_refused_with_its_estimate():
    # a synthetic case far past the tpu suite's (no fixture is made: the estimate is its shapes')
    case = Case(name="interpret-cost-huge", batch=32, sequence=8192, streams=4, embedding=4096)
    cost = interpret_cost.SECONDS_PER_ELEMENT["cpu"]
    for path in (Path(INTERPRET, None), Path(INTERPRET, (2, 4), host=True)):
        estimate = interpret_estimate_s(case, path)
        assert estimate == pytest.approx(cost.compile_s + cost.seconds_per_element * 32 * 8192 * 4 * 4096)
        assert estimate > interpret_cost.INTERPRET_BUDGET_S
        reason = interpret_refusal(case, path)
        assert f"about {estimate:,.0f} s" in reason and cost.measured in reason and "4,294,967,296" in reason


def test_what_is_affordable_or_unmeasured_runs(monkeypatch):
    for case in registry.select(suite="default"):  # every default-suite case runs interpret mode on a CPU
        assert interpret_refusal(case, Path(INTERPRET, None)) == ""
    case = registry.get(MESHED)  # the tpu suite's host paths: about 5 s each, measured
    assert interpret_estimate_s(case, Path(INTERPRET, case.mesh, host=True)) < interpret_cost.INTERPRET_BUDGET_S / 4
    assert interpret_refusal(case, Path(INTERPRET, case.mesh, host=True)) == ""
    assert interpret_estimate_s(case, Path(REFERENCE, None, host=True)) is None  # not interpret mode
    monkeypatch.setattr(interpret_cost.jax, "default_backend", lambda: "tpu")
    # on the chip: no measured cost, so it runs (its rows' execute_s measure it)
    assert interpret_estimate_s(case, Path(INTERPRET, None)) is None
    assert interpret_estimate_s(case, Path(INTERPRET, case.mesh, host=True)) is not None  # the host's is


@pytest.mark.slow
def test_a_refused_interpret_path_gives_skip_rows_and_the_others_run(tmp_path, monkeypatch):
    monkeypatch.setattr(interpret_cost, "INTERPRET_BUDGET_S", 0.5)  # under any compile: refuse every one
    runner = Runner(load_policy(), Collaborators(oracle=OracleCache(tmp_path / "oracle")))
    rows = list(runner.run_case(SMALL, PathPlan((REFERENCE, INTERPRET), lowering=False)))
    interpret = [row for row in rows if row["candidate"] == "interpret/unsharded"]
    assert interpret and {row["verdict"] for row in interpret} == {"skip"}
    assert all("would take about" in row["reason"] and "not run" in row["reason"] for row in interpret)
    assert {row["verdict"] for row in rows if row["candidate"] == "reference/unsharded"} == {"pass"}
