"""An implementation under test that never runs does not pass (issue 49, 2).

A wrong kernel (x1.5) whose envelope fits no case, or that serves no variant, produced only
`unsupported` rows, or none: the run passed on its reference's rows, and a baseline of it
gated nothing. "Nothing compared", which a run that compared nothing at all already was
(`mhc_parity.reports.causes.uncompared`), now holds per implementation under test: `mhc-parity
run` exits 2 with one line, `ParityRun.passed` is False with its `reason`, a pytest session
fails, and no baseline is written of it.
"""

from __future__ import annotations

import pytest

import mhc_parity.harness
from mhc_parity.harness.cli import main as cli_main
from mhc_parity.reports.causes import uncompared
from mhc_parity.reports.samples import measured_row
from mhc_parity.reports.terminal import exit_code, run_verdict
from tests.cli_support import run_cli
from tests.test_pytest_plugin import _inner_run

CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"
pytest_plugins = ["pytester"]  # the inner pytest run of the plugin
PATHS = ("reference/unsharded", "never_runs/*", "serves_no_variant/*")
OUTSIDE = "embedding 128 is not a multiple of 256 (the envelope's alignment)"


def _rows(impl_verdict: str) -> list[dict]:
    """The reference's passing row and `kern`'s row with `impl_verdict`."""
    reference = measured_row(CASE, "reference/unsharded", "oracle", "vs_oracle", "out", "output", "float32", 1.0)
    kernel = measured_row(CASE, "kern/unsharded", "oracle", "vs_oracle", "out", "output", "float32", 1.0)
    if impl_verdict != "pass":
        kernel = {**kernel, "verdict": impl_verdict, "reason": OUTSIDE, "bound_usage": float("nan")}
    return [reference, kernel]


def test_an_implementation_with_no_compared_row_is_nothing_compared_not_a_pass():
    assert run_verdict(_rows("pass"), ["kern"]) == "PASS"
    for verdict in ("unsupported", "skip"):
        rows = _rows(verdict)
        assert uncompared(rows, ["kern"]) == ["kern"]
        assert run_verdict(rows, ["kern"]) == "NOTHING COMPARED" and exit_code(rows, None, ["kern"]) == 2
        assert run_verdict(rows) == "PASS", "the built-in paths' run: the reference compared"
    assert run_verdict(_rows("pass")[:1], ["kern"]) == "NOTHING COMPARED", "no row of it at all"
    assert uncompared([], ["kern"]) == ["the run"]


@pytest.fixture(scope="module")
def never_run():
    return mhc_parity.harness.run_parity(
        ["tests.external_impls:never_runs", "tests.external_impls:serves_no_variant"], cases=CASE, paths=PATHS
    )


def test_the_api_run_of_an_implementation_that_never_runs_has_not_passed(never_run, tmp_path):
    verdicts = lambda name: set(never_run.implementation_rows(name)["verdict"])  # noqa: E731
    assert verdicts("never_runs") == {"unsupported"} and verdicts("serves_no_variant") <= {"unsupported", "skip"}
    assert not never_run.passed and never_run.verdict == "NOTHING COMPARED"
    assert "nothing was compared of implementation 'never_runs'" in never_run.reason
    assert "'serves_no_variant'" in never_run.reason and "\n" not in never_run.reason
    assert "parity: NOTHING COMPARED" in never_run.summary()
    with pytest.raises(mhc_parity.harness.ReportError, match="refusing a baseline that would gate nothing"):
        never_run.write_baseline(tmp_path / "never.csv", implementation="never_runs")
    assert not (tmp_path / "never.csv").exists()
    never_run.write_reports(tmp_path / "run")
    assert "NOTHING COMPARED" in (tmp_path / "run" / "summary.md").read_text()
    target = tmp_path / "from-run.csv"
    args = ["baseline", "--from", str(tmp_path / "run"), "--impl", "never_runs", "--to", str(target)]
    assert cli_main(args) == 2 and not target.exists()


@pytest.mark.slow
def test_the_cli_run_of_an_implementation_that_never_runs_exits_2_with_one_line(tmp_path):
    proc = run_cli(
        "run",
        "--impl",
        "tests.external_impls:never_runs",
        "--cases",
        CASE,
        "--paths",
        "reference/unsharded",
        "never_runs/*",
        "--no-lowering",
        "--jobs",
        "1",
        "--quiet",
        "--out",
        tmp_path / "run",
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mhc-parity: error:")]
    assert len(errors) == 1 and "nothing was compared of implementation 'never_runs'" in errors[0], proc.stderr
    assert "parity: NOTHING COMPARED" in proc.stdout and "parity: PASS" not in proc.stdout


def test_a_pytest_session_of_an_implementation_that_never_runs_fails(pytester, monkeypatch):
    """Its tests pass (an `unsupported` row is explained), yet the session fails: what it tests compared nothing."""
    rows = [{**r, "candidate": r["candidate"].replace("kern/", "my_mhc/")} for r in _rows("unsupported")]
    recorder = _inner_run(pytester, monkeypatch, {CASE: rows})()
    assert recorder.ret == pytest.ExitCode.TESTS_FAILED
    passing = _inner_run(pytester, monkeypatch, {CASE: [{**rows[1], "verdict": "pass", "reason": ""}, rows[0]]})()
    assert passing.ret == pytest.ExitCode.OK
