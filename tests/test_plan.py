"""The planned matrix (mhc_parity.harness.engine.plan) and the progress heartbeat (commands.progress)."""

from __future__ import annotations

import io
import threading
import time

import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.catalogue import make_case
from mhc_parity.harness.commands.progress import Progress
from mhc_parity.harness.engine.implementations import BUILTIN
from mhc_parity.harness.engine.plan import PathPlan, planned_leaves, uncovered_judgements, unmatched_path_globs
from mhc_parity.harness.judging.policy_file import load_policy, parse_policy
from mhc_parity.records.schema import PROGRAM_COMPARISONS
from mhc_parity.reports import load_baseline
from tests.cli_support import ROOT

PLAN = PathPlan(implementations=tuple(BUILTIN.values()))
SHARDED = make_case(batch=2, sequence=64, mesh=(2, 4), block_tokens=8)


def test_planned_leaf_dtypes_are_the_dtypes_the_runs_produce():
    """Every measured row of the committed baseline (the default suite through every
    path) has the dtype the plan predicts for its leaf."""
    cases = {c.name: c for c in registry.default_registry()}
    frame = load_baseline(ROOT / "baselines" / "default.csv").frame
    # Numeric rows only: a compile row's dtype is the one its program was compiled in.
    measured = frame[(frame["dtype"] != "") & ~frame["comparison"].isin(PROGRAM_COMPARISONS)]
    mismatched = [
        (row.case, row.leaf, row.dtype)
        for row in measured.itertuples()
        if planned_leaves(cases[row.case]).get(row.leaf) != row.dtype
    ]
    assert len(measured) > 1000 and not mismatched, mismatched[:5]


def test_a_mistyped_paths_glob_gets_a_hint():
    plan = PathPlan(implementations=PLAN.implementations, path_globs=("interpet/*", "reference/*", "oracle"))
    problems = unmatched_path_globs(plan, [SHARDED])
    assert len(problems) == 2
    assert "did you mean 'interpret/*'" in problems[0]
    assert "the oracle is not a path" in problems[1]
    assert unmatched_path_globs(PathPlan(PLAN.implementations, ("*/sharded*", "lowering/*")), [SHARDED]) == []
    # A sharded glob selects nothing among unsharded cases.
    assert unmatched_path_globs(PathPlan(PLAN.implementations, ("*/sharded*",)), [make_case()])


def test_the_packaged_policy_covers_every_suite_and_a_partial_one_is_caught():
    everything = list(registry.default_registry())
    assert uncovered_judgements(load_policy(), everything, PLAN) == []
    partial = parse_policy(
        'version = 2\n[[rule]]\ncomparison = "vs_oracle"\ndtype = "*"\nleaf_kind = "*"\n'
        'kind = "ulps_of_max"\nmax_rel_ulps = 4\nrationale = "only vs_oracle"\n'
    )
    problems = uncovered_judgements(partial, [SHARDED], PLAN)
    for comparison, missing in (("vs_reference", True), ("vs_unsharded", True), ("vs_oracle", False)):
        assert any(f"(comparison={comparison}," in p for p in problems) == missing, comparison
    reference_only = PathPlan(PLAN.implementations, ("reference/unsharded",))
    assert uncovered_judgements(partial, [SHARDED], reference_only) == []


# ----------------------------------------------------------------------------- progress


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("stream_kind", ["log", "terminal"])
def test_the_running_case_and_path_show_while_a_case_runs(stream_kind):
    stream = FakeTerminal() if stream_kind == "terminal" else io.StringIO()
    progress = Progress(2, stream=stream, heartbeat_s=0.02)
    case = make_case()
    progress.start(case)
    progress.step(case, "interpret/unsharded")
    marker = "interpret/unsharded for "
    wait_until(lambda: stream.getvalue().count(marker) >= 2)  # refreshed, not printed once
    progress.finish(case, [{"verdict": "pass"}])
    progress.close()
    assert not any(t.name == "progress-heartbeat" and t.is_alive() for t in threading.enumerate())
    if stream_kind == "log":
        beats = [line for line in stream.getvalue().splitlines() if line.startswith("... still running")]
        assert beats and all(marker in line and f"s: case {case.name}" in line for line in beats)


def test_no_heartbeat_when_lines_come_often_enough():
    stream = io.StringIO()
    progress = Progress(3, stream=stream, heartbeat_s=3600)
    for _ in range(3):
        case = make_case()
        progress.start(case)
        progress.finish(case, [])
    progress.close()
    assert "still running" not in stream.getvalue() and len(stream.getvalue().splitlines()) == 3
