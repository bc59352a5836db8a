"""The public API (`mhc_parity.harness.api`, re-exported by `mhc_parity.harness`): one test per entry point,
on one small float32 case through an external implementation and the reference."""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

import pandas as pd
import pytest

import mhc_parity.harness
from mhc_parity.harness import api
from mhc_parity.harness.cli import main as cli_main
from mhc_parity.harness.commands.baseline import baseline_parser, run_arguments
from mhc_parity.records.schema import ROW_COLUMNS
from mhc_parity.reports import load_baseline, load_run
from tests.external_impls import WrappedReference

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"
GOOD = "tests.external_impls:good"


@pytest.fixture(scope="module")
def good_run() -> api.ParityRun:
    return mhc_parity.harness.run_parity(GOOD, cases=[CASE])


@pytest.fixture(scope="module")
def drifted_run() -> api.ParityRun:
    return mhc_parity.harness.run_parity("tests.external_impls:drifted", cases=[CASE])


def test_the_package_exports_the_api_names():
    assert set(mhc_parity.harness.__all__) <= set(dir(api))
    assert mhc_parity.harness.run_parity is api.run_parity and mhc_parity.harness.gate is api.gate
    with pytest.raises(AttributeError):
        mhc_parity.harness.no_such_name  # noqa: B018


def test_run_parity_runs_the_implementation_and_its_reference_partner(good_run):
    assert good_run.passed and good_run.verdict == "PASS"
    assert isinstance(good_run.rows, pd.DataFrame) and list(good_run.rows.columns) == list(ROW_COLUMNS)
    assert set(good_run.rows["candidate"]) == {"wrapped_reference/unsharded", "reference/unsharded"}
    assert set(good_run.rows["comparison"]) == {"vs_oracle", "vs_reference"}  # no lowering rows
    assert good_run.failures.empty and good_run.failure_table() == ""
    assert good_run.implementations == ("wrapped_reference",)
    assert len(good_run.implementation_rows()) == len(
        good_run.rows[good_run.rows["candidate"].str.startswith("wrapped")]
    )


def test_a_broken_implementation_fails_with_its_leaf_table():
    run = mhc_parity.harness.run_parity("tests.external_impls:broken", cases=[CASE])
    assert not run.passed and run.verdict == "FAIL"
    assert set(run.failures["candidate"]) == {"loses_post_gate_factor/unsharded"}
    assert "loses_post_gate_factor/unsharded vs oracle" in run.failure_table()


def test_prepare_checks_everything_before_computing():
    prepared = mhc_parity.harness.prepare(GOOD, suite="smoke", dtype="bf16")
    assert prepared.implementation_names == ("wrapped_reference",)
    assert prepared.cases and all(c.dtype == "bfloat16" for c in prepared.cases)
    assert not prepared.plan.lowering
    with pytest.raises(mhc_parity.harness.ConfigurationError, match="matches no registered case"):
        mhc_parity.harness.prepare(GOOD, cases=["no-such-case*"])
    with pytest.raises(mhc_parity.harness.ConfigurationError, match="cannot import"):
        mhc_parity.harness.prepare("no_such_module:factory")
    with pytest.raises(mhc_parity.harness.ConfigurationError, match="did you mean"):
        mhc_parity.harness.prepare(GOOD, cases=[CASE], paths=["wrapped_referense/*"])


def test_errors_are_typed_and_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(mhc_parity.harness.ReportError) as caught:
        mhc_parity.harness.run_parity(GOOD, cases=[CASE], out=blocker / "out")
    assert "\n" not in str(caught.value)
    assert issubclass(mhc_parity.harness.ConfigurationError, mhc_parity.harness.ParityError)
    assert issubclass(mhc_parity.harness.BaselineError, mhc_parity.harness.ParityError)


def test_write_reports_writes_a_run_folder_the_cli_accepts(good_run, tmp_path):
    paths = good_run.write_reports(tmp_path / "run")
    assert {p.name for p in paths.values()} == {"rows.csv", "report.json", "report.html", "summary.md", "speed.csv"}
    loaded = load_run(tmp_path / "run", require_current_code=True)
    assert len(loaded.frame) == len(good_run.rows)
    assert loaded.manifest.request.implementations == (("wrapped_reference", GOOD),)
    assert cli_main(["render", "--rows", str(tmp_path / "run"), "--out", str(tmp_path / "again")]) == 0


def test_write_baseline_keeps_the_implementations_rows_under_its_name(good_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = good_run.write_baseline()
    assert path.as_posix() == "baselines/wrapped_reference.csv"
    baseline = load_baseline(path)
    assert baseline.implementation == "wrapped_reference"
    assert set(baseline.frame["candidate"]) == {"wrapped_reference/unsharded"}


def test_gate_passes_the_same_code_and_flags_a_drift_beyond_the_growth_factor(good_run, drifted_run, tmp_path):
    baseline = good_run.write_baseline(tmp_path / "wrapped.csv")
    assert mhc_parity.harness.gate(good_run, baseline).ok
    result = mhc_parity.harness.gate(drifted_run, baseline)
    assert not result.ok
    drifted = {f.key[3] for f in result.regressions}
    assert "out" in drifted and all(f.growth > 2 for f in result.regressions)
    assert result.current_rows == result.baseline_rows  # only the implementation's rows are gated


def test_harness_gate_flags_the_drift_of_an_external_run_against_its_own_baseline(
    good_run, drifted_run, tmp_path, capsys
):
    good_run.write_reports(tmp_path / "good")
    drifted_run.write_reports(tmp_path / "drifted")
    assert (
        cli_main(["baseline", "--from", str(tmp_path / "good"), "--impl", GOOD, "--to", str(tmp_path / "base.csv")])
        == 0
    )
    assert cli_main(["gate", "--baseline", str(tmp_path / "base.csv"), "--current", str(tmp_path / "good")]) == 0
    capsys.readouterr()
    assert cli_main(["gate", "--baseline", str(tmp_path / "base.csv"), "--current", str(tmp_path / "drifted")]) == 1
    out = capsys.readouterr().out
    assert "gating implementation 'wrapped_reference'" in out and "regression" in out


def test_a_baseline_of_another_implementation_is_refused(good_run, tmp_path, capsys):
    good_run.write_reports(tmp_path / "good")
    other = mhc_parity.harness.run_parity("mhc_parity.harness.faults.independent_mhc:factory", cases=[CASE])
    other_baseline = other.write_baseline(tmp_path / "independent.csv")
    with pytest.raises(mhc_parity.harness.BaselineError, match="belongs to implementation 'independent'"):
        mhc_parity.harness.gate(good_run, other_baseline)
    assert cli_main(["gate", "--baseline", str(other_baseline), "--current", str(tmp_path / "good")]) == 2
    assert "belongs to implementation 'independent'" in capsys.readouterr().err
    with pytest.raises(mhc_parity.harness.BaselineError, match="built-in paths' baseline"):
        mhc_parity.harness.gate(good_run, ROOT / "baselines" / "default.csv")


def test_gate_takes_a_run_never_a_baseline_and_a_legacy_baseline_only_when_allowed(good_run, tmp_path):
    from tests.cli_support import as_format_1

    baseline = good_run.write_baseline(tmp_path / "good.csv")
    with pytest.raises(
        mhc_parity.harness.BaselineError, match=r"good.csv is a baseline file, not a run: pass the run's folder"
    ):
        mhc_parity.harness.gate(baseline, baseline)
    legacy = as_format_1(baseline, tmp_path / "legacy.csv")
    with pytest.raises(
        mhc_parity.harness.BaselineError, match=r"format 1 is a legacy format .* allow_legacy_baseline=True"
    ):
        mhc_parity.harness.gate(good_run, legacy)
    assert mhc_parity.harness.gate(good_run, legacy, allow_legacy_baseline=True).ok
    folder = tmp_path / "run"
    good_run.write_reports(folder)
    with pytest.raises(mhc_parity.harness.ReportError, match="is the rows.csv of the run folder"):
        good_run.write_baseline(folder / "rows.csv")


def test_harness_baseline_impl_runs_the_implementation_and_writes_its_baseline(tmp_path, capsys):
    code = cli_main(
        [
            "baseline",
            "--impl",
            GOOD,
            "--cases",
            CASE,
            "--out",
            str(tmp_path / "run"),
            "--to",
            str(tmp_path / "mine.csv"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert load_baseline(tmp_path / "mine.csv").implementation == "wrapped_reference"
    assert load_run(tmp_path / "run").manifest.request.paths == ("reference/*", "wrapped_reference/*")
    assert cli_main(["baseline", "--impl", "no_such_module:factory", "--out", str(tmp_path / "x")]) == 2
    assert "cannot import 'no_such_module'" in capsys.readouterr().err


def test_baseline_from_a_run_gate_and_the_idle_pytest_plugin_load_no_jax():
    """Nor matplotlib: the plugin is imported by every pytest run of an environment that has
    mhc-parity installed, and only a figure not stored yet draws (`mhc_parity.reports.html.figures.figure_svg`)."""
    code = (
        "import sys, mhc_parity.harness, mhc_parity.harness.cli, mhc_parity.harness.commands.baseline\n"
        "import mhc_parity.harness.pytest_plugin, mhc_parity.harness.commands.gate\n"
        "assert 'jax' not in sys.modules, 'jax was imported'\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib was imported'\n"
        "import mhc_parity.reports\n"
        "assert mhc_parity.reports.write_all is mhc_parity.reports.writers.write_all\n"
        "assert 'matplotlib' not in sys.modules, 'the report writers imported matplotlib before drawing'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_an_implementation_name_with_glob_characters_selects_its_own_paths():
    """The default path globs take an implementation's name literally: built unescaped, a kernel
    named `[r]eference` selected the reference's paths only (its own never ran, and the run
    passed), and one named `kern[v2]` selected nothing (a usage error the user never caused)."""
    for name in ("[r]eference", "kern[v2]", "k*?"):
        prepared = mhc_parity.harness.prepare(WrappedReference(name=name), cases=[CASE])
        assert prepared.plan.selected_names(prepared.cases) == ["reference/unsharded", f"{name}/unsharded"]
    args = baseline_parser().parse_args(["--impl", "pkg:kern"])
    assert run_arguments(args, "kern[v2]")[2:5] == ["--paths", "reference/*", "kern[[]v2]/*"]


def test_write_reports_refuses_a_folder_of_files_that_is_not_a_run(good_run, tmp_path):
    """`ParityRun.write_reports` (and `run_parity(out=...)`, checked before it computes) into a
    folder holding files but no run manifest: ReportError, the files untouched."""
    (tmp_path / "summary.md").write_text("my notes\n")
    with pytest.raises(mhc_parity.harness.ReportError, match="holds files .summary.md. but no run manifest"):
        good_run.write_reports(tmp_path)
    with pytest.raises(mhc_parity.harness.ReportError, match="holds files .summary.md. but no run manifest"):
        mhc_parity.harness.run_parity(GOOD, cases=["no-such-case"], out=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.md"]
    assert (tmp_path / "summary.md").read_text() == "my notes\n"


def test_a_run_s_records_are_read_only_and_exactly_its_manifest_s(good_run):
    """A verdict flipped in memory made `passed` say what never ran (and `write_reports` then
    raised a bare ValueError): the records are read-only, a run built of other records than
    its manifest's is refused, and changing the `rows` frame changes nothing of the run."""
    with pytest.raises(TypeError):
        good_run.records[0]["verdict"] = "fail"
    with pytest.raises(TypeError):
        good_run.metadata["policy_is_default"] = False
    flipped = [{**r, "verdict": "fail"} if i == 0 else r for i, r in enumerate(good_run.records)]
    with pytest.raises(mhc_parity.harness.ReportError, match="not those run .* recorded"):
        dataclasses.replace(good_run, records=tuple(flipped))
    frame = good_run.rows
    frame.loc[frame.index[0], "verdict"] = "fail"
    assert good_run.passed and good_run.failures.empty and (good_run.rows["verdict"] != "fail").all()


def test_the_api_gate_refuses_an_infinite_growth_factor_or_noise_floor(tmp_path):
    """As `mhc-parity gate --growth-factor/--noise-floor-ulps`: an infinite value would switch
    the growth check off; refused before anything is read."""
    for keyword in ("growth_factor", "noise_floor_ulps"):
        with pytest.raises(mhc_parity.harness.ConfigurationError, match=f"{keyword} must be a finite number"):
            mhc_parity.harness.gate(tmp_path / "run", tmp_path / "b.csv", **{keyword: float("inf")})
