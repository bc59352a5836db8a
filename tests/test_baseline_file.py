"""The committed baseline stays consistent with the code that gates against it."""

import pathlib

import pytest

from cases import registry
from harness.policy import load_policy
from reports import load_baseline
from reports.rows import ReportInputError

BASELINE = pathlib.Path(__file__).resolve().parent.parent / "baselines" / "default.csv"


def test_committed_baseline_was_made_under_the_current_policy():
    """A tolerance change must come with `make baseline` (the gate refuses a hash mismatch)."""
    baseline = load_baseline(BASELINE)
    assert baseline.policy_hash == load_policy().digest, (
        "harness/tolerances.toml changed since baselines/default.csv was written: run `make baseline`"
    )


def test_committed_baseline_covers_the_default_suite_and_passes():
    frame = load_baseline(BASELINE).frame
    assert set(frame["case"]) == {case.name for case in registry.default_registry().select(suite="default")}
    assert set(frame["verdict"]) <= {"pass", "skip", "unsupported"}


def _edited_baseline(tmp_path, edit) -> pathlib.Path:
    """The committed baseline with `edit(fields)` applied to its first compared, measured row."""
    lines = BASELINE.read_text().splitlines(keepends=True)
    columns = lines[1].rstrip("\n").split(",")
    for index, line in enumerate(lines[2:], start=2):
        fields = line.rstrip("\n").split(",")
        row = dict(zip(columns, fields))
        if row["verdict"] == "pass" and row["comparison"] != "lowering":
            lines[index] = ",".join(edit(columns, fields)) + "\n"
            break
    path = tmp_path / "edited.csv"
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("cell", ["nan", "inf", ""])
def test_a_compared_row_with_a_non_finite_or_empty_error_is_refused(tmp_path, cell):
    def edit(columns, fields):
        fields[columns.index("cand_oracle_max_err")] = cell
        return fields

    with pytest.raises(ReportInputError, match=r"line 3, column 'cand_oracle_max_err': a pass row needs a finite"):
        load_baseline(_edited_baseline(tmp_path, edit))


def test_a_row_cut_short_is_refused_naming_its_line(tmp_path):
    with pytest.raises(ReportInputError, match=r"line 3: 10 fields, the baseline's columns are 14"):
        load_baseline(_edited_baseline(tmp_path, lambda columns, fields: fields[:10]))


def test_the_gate_exits_2_on_such_a_baseline(tmp_path):
    from reports.samples import write_sample_run
    from tests.cli_support import run_cli

    write_sample_run([], tmp_path / "run", rendered=False)
    baseline = _edited_baseline(tmp_path, lambda columns, fields: fields[:10])
    result = run_cli("gate", "--baseline", baseline, "--current", tmp_path / "run")
    assert result.returncode == 2 and "10 fields" in result.stderr, result.stderr[-2000:]
