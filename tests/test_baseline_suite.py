"""`mhc-parity baseline` never writes one suite's rows over the baseline of another.

Reproduction (issue 56, item 4): `make baseline` with SUITE=smoke exported wrote the smoke
suite's rows over the default suite's baseline, dropping every case the smoke suite lacks;
the gate then passes their regressions as rows the baseline does not hold. The header now
records the suite, and `baseline` refuses (exit 2, one line naming both suites) to write
another's rows over it; a file recording no suite is replaced only by rows keeping its cases.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mhc_parity.harness.commands.baseline import main as baseline_main
from mhc_parity.records.run_suite import run_suite
from mhc_parity.reports.gate.baseline_file import load_baseline, write_baseline
from mhc_parity.reports.samples import run_request as request
from mhc_parity.reports.samples import sample_manifest, sample_rows, write_sample_run


def passing_rows() -> list[dict]:
    return [dict(r) for r in sample_rows() if r["verdict"] in ("pass", "skip", "unsupported")]


def write_run(folder: Path, rows: list[dict], **given) -> Path:
    """`rows` as a complete run folder whose manifest records the request `request(**given)`."""
    manifest = sample_manifest(rows, policy_digest="p1")
    manifest = dataclasses.replace(manifest, request=request(**given))
    write_sample_run(
        rows, folder, metadata={"policy_hash": "p1"}, policy_digest="p1", rendered=False, manifest=manifest
    )
    return folder


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({}, "default"),
        ({"suite": "smoke"}, "smoke"),
        ({"suite": "default", "dtype": "float32"}, "default --dtype float32"),
        ({"case_globs": ("lite-*", "mhc-n4")}, "--cases 'lite-*' mhc-n4"),
        ({"case_files": ("mine.toml",)}, "user --case-file mine.toml"),
        ({"suite": "smoke", "tags": ("fast",), "seed": 3}, "smoke --tags fast --seed 3"),
    ],
)
def test_a_run_names_the_suite_it_selected_and_what_narrowed_it(given, named):
    assert run_suite(request(**given)) == named


def test_rows_without_a_manifest_name_no_suite():
    assert run_suite(None) is None


def test_a_baseline_records_its_suite_and_refuses_another_suites_rows(tmp_path, capsys):
    default_run = write_run(tmp_path / "default-run", passing_rows())
    smoke_run = write_run(tmp_path / "smoke-run", passing_rows(), suite="smoke")
    target = tmp_path / "baselines" / "default.csv"
    assert baseline_main(["--from", str(default_run), "--to", str(target)]) == 0
    assert load_baseline(target).suite == "default"
    written = target.read_bytes()
    capsys.readouterr()

    assert baseline_main(["--from", str(smoke_run), "--to", str(target)]) == 2
    err = one_line_error(capsys)
    assert f"{target} is the baseline of suite 'default'" in err and "rows of suite 'smoke'" in err
    assert "--to FILE" in err and "BASELINE=FILE" in err
    assert target.read_bytes() == written  # untouched

    assert baseline_main(["--from", str(default_run), "--to", str(target)]) == 0  # its own suite again
    other = tmp_path / "baselines" / "smoke.csv"
    assert baseline_main(["--from", str(smoke_run), "--to", str(other)]) == 0
    assert load_baseline(other).suite == "smoke"


def test_a_narrowed_selection_is_not_its_suite(tmp_path, capsys):
    target = tmp_path / "default.csv"
    assert baseline_main(["--from", str(write_run(tmp_path / "all", passing_rows())), "--to", str(target)]) == 0
    narrowed = write_run(tmp_path / "f32", passing_rows(), dtype="float32")
    capsys.readouterr()
    assert baseline_main(["--from", str(narrowed), "--to", str(target)]) == 2
    assert "rows of selection 'default --dtype float32'" in one_line_error(capsys)


def test_a_baseline_recording_no_suite_is_replaced_only_by_rows_keeping_its_cases(tmp_path, capsys):
    """The committed baselines were written before the header recorded a suite."""
    rows = passing_rows()
    target = write_baseline(rows, tmp_path / "default.csv", policy_hash="p1")
    assert load_baseline(target).suite is None
    written = target.read_bytes()
    kept, dropped = sorted({r["case"] for r in rows})[:1], sorted({r["case"] for r in rows})[1:]
    assert dropped
    fewer = write_run(tmp_path / "smoke-run", [r for r in rows if r["case"] in kept], suite="smoke")
    assert baseline_main(["--from", str(fewer), "--to", str(target)]) == 2
    err = one_line_error(capsys)
    assert f"{target} records no suite and holds {len(dropped)} case(s)" in err
    assert f"rows of suite 'smoke' lack (e.g. {dropped[0]})" in err
    assert target.read_bytes() == written

    assert baseline_main(["--from", str(write_run(tmp_path / "all", rows)), "--to", str(target)]) == 0
    assert load_baseline(target).suite == "default"


def test_the_python_api_refuses_another_suites_rows_too(tmp_path):
    from mhc_parity.harness.api import ParityRun, ReportError

    def parity_run(**given) -> ParityRun:
        rows = passing_rows()
        manifest = dataclasses.replace(sample_manifest(rows, policy_digest="p1"), request=request(**given))
        return ParityRun(rows, {"policy_hash": "p1"}, manifest, implementations=("interpret",))

    target = parity_run().write_baseline(tmp_path / "interpret.csv")
    assert load_baseline(target).suite == "default"
    with pytest.raises(ReportError, match="is the baseline of suite 'default'; refusing to write the rows of suite"):
        parity_run(suite="smoke").write_baseline(target)
