"""Runs that compute no numbers: only lowering and compile rows selected, or the `tpu` suite's
cases off a TPU (their paths refused up front, each a `skip` row saying why). Neither makes a
fixture or an oracle answer, so neither is refused for the float64 oracle's memory; a case
whose numbers would run still is."""

from __future__ import annotations

import csv

import jax
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.spec import TPU_TAG
from mhc_parity.harness.engine import runner as runner_module
from mhc_parity.harness.engine.case_memory import too_large
from mhc_parity.harness.engine.collaborators import Collaborators, OracleFunction
from mhc_parity.harness.engine.implementations import BUILTIN
from mhc_parity.harness.engine.plan import PathPlan, comparisons_of, device_shortfalls, numbers_refusal
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.engine.tpu_targets import compiler_missing
from mhc_parity.harness.judging.policy_file import load_policy
from tests.cli_support import run_cli

# The `tpu` suite's case with a token mesh, and its cheapest case to compile.
TPU_MESH_CASE = "lite-n4-c1024-b8s1024-bf16-w32-mlp-default-m2x4"
TPU_SMALL_CASE = "lite-n4-c2048-b2s1024-bf16-w32-identity-default"
SMOKE_CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"


def _no_numbers(*args):
    raise AssertionError("a case that needs no numbers made its fixture or its oracle answer")


def _runner() -> Runner:
    return Runner(load_policy(None), Collaborators(fixture_loader=_no_numbers, oracle=OracleFunction(_no_numbers)))


def _identity(row: dict) -> tuple:
    return row["candidate"], row["partner"], row["comparison"], row["verdict"], row["reason"]


def _plan(*globs: str, lowering: bool = False) -> PathPlan:
    return PathPlan(implementations=tuple(BUILTIN.values()), path_globs=globs or ("*",), lowering=lowering)


def test_a_tpu_case_off_a_tpu_makes_no_fixture_and_each_of_its_paths_is_a_skip_saying_why():
    case, plan = registry.get(TPU_MESH_CASE), _plan()
    assert TPU_TAG in case.all_tags and jax.default_backend() == "cpu"
    assert not plan.needs_numbers(case)
    reason = numbers_refusal(case)
    assert "tagged 'tpu'" in reason and "runs on cpu" in reason and "compile rows" in reason
    rows = list(_runner().run_case(case, plan))
    paths = plan.paths_for(case)
    expected = [(path.name, comparison) for path in paths for comparison, _ in comparisons_of(path, paths)]
    assert [(r["candidate"], r["comparison"]) for r in rows] == expected
    assert {r["verdict"] for r in rows} == {"skip"} and {r["reason"] for r in rows} == {reason}
    # The compile-ahead route of a whole run loads nothing either.
    ((ran, again),) = list(_runner().run([case], plan))
    assert ran is case and [_identity(r) for r in again] == [_identity(r) for r in rows]
    # Its sharded paths run nowhere here, so they need no devices.
    assert device_shortfalls(plan, [case]) == []


def test_only_lowering_and_compile_rows_selected_make_no_fixture_and_no_oracle(monkeypatch):
    made = {"case": "x", "candidate": "lowering/unsharded", "verdict": "pass"}
    monkeypatch.setattr(runner_module, "lowering_rows", lambda case, store, selects: [made])
    monkeypatch.setattr(runner_module, "compile_rows", lambda case, store, selects, impls: iter(()))
    case, plan = registry.get(SMOKE_CASE), _plan("lowering/*", "compile/*", lowering=True)
    assert plan.paths_for(case) == [] and not plan.needs_numbers(case)
    assert list(_runner().run_case(case, plan)) == [made]
    assert [rows for _, rows in _runner().run([case], plan)] == [[made]]


def test_on_a_tpu_a_tpu_case_s_numbers_run_and_its_oracle_s_memory_is_still_checked(monkeypatch):
    case, plan = registry.get(TPU_SMALL_CASE), _plan()
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert numbers_refusal(case) == "" and plan.needs_numbers(case)
    # What `mhc-parity run` refuses up front: the chunked oracle's floor for it is 2.5 GiB.
    assert "needs at least" in too_large(case, memory=2 * 2**30)
    assert too_large(case, memory=24 * 2**30) == ""  # a CI machine's memory: it fits
    assert not _plan("compile/*").needs_numbers(case)  # compile rows alone need no numbers anywhere


def test_a_tpu_case_on_a_cpu_is_a_run_of_explained_skips_not_a_refusal_of_its_memory(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", "--suite", "tpu", "--cases", TPU_MESH_CASE, "--no-lowering", "--quiet", "--out", out)
    # Nothing else selected: nothing compared (exit 2), but the run ran and says why each path did not.
    assert proc.returncode == 2, proc.stderr
    assert "nothing was compared" in proc.stderr and "tagged 'tpu'" in proc.stderr
    assert "float64 oracle" not in proc.stderr
    with open(out / "rows.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and {r["verdict"] for r in rows} == {"skip"}
    assert all("tagged 'tpu'" in r["reason"] for r in rows)


@pytest.mark.slow
@pytest.mark.skipif(bool(compiler_missing()), reason=compiler_missing() or "libtpu is installed")
def test_a_tpu_case_on_a_cpu_passes_with_its_compile_rows_and_its_paths_explained_skips(tmp_path):
    out = tmp_path / "run"
    paths = ("compile/v5e/*", "reference/*", "interpret/*", "mosaic/*")
    args = ("run", "--suite", "tpu", "--cases", TPU_SMALL_CASE, "--paths", *paths)
    proc = run_cli(*args, "--quiet", "--out", out, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "rows.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    compiled = [r for r in rows if r["comparison"] == "compile"]
    assert len(compiled) == 4 and {r["verdict"] for r in compiled} == {"pass"}, compiled
    others = [r for r in rows if r["comparison"] != "compile"]
    assert {r["candidate"] for r in others} == {"reference/unsharded", "interpret/unsharded", "mosaic/unsharded"}
    assert {r["verdict"] for r in others} == {"skip"} and all("tagged 'tpu'" in r["reason"] for r in others)
