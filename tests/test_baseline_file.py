"""The committed baseline stays consistent with the code that gates against it."""

import pathlib

import pytest

from mhc_parity.cases import registry
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records.rows import ReportInputError
from mhc_parity.reports import load_baseline
from mhc_parity.reports.gate.baseline_file import BASELINE_FORMAT_VERSION, parse_header

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASELINE = ROOT / "baselines" / "default.csv"
# The example repository's baseline (examples/external_kernel: parity_suite = "smoke").
EXAMPLE_BASELINE = ROOT / "examples" / "external_kernel" / "baselines" / "my_mhc.csv"


def test_committed_baseline_was_made_under_the_current_policy():
    """A tolerance change must come with `make baseline` (the gate refuses a hash mismatch)."""
    baseline = load_baseline(BASELINE)
    assert baseline.policy_hash == load_policy().digest, (
        "mhc_parity/harness/judging/tolerances.toml changed since baselines/default.csv was written: "
        "run `make baseline`"
    )


def test_committed_baseline_covers_the_default_suite_and_passes():
    frame = load_baseline(BASELINE).frame
    assert set(frame["case"]) == {case.name for case in registry.default_registry().select(suite="default")}
    assert set(frame["verdict"]) <= {"pass", "skip", "unsupported"}


def test_the_example_baseline_is_my_mhcs_over_its_suite_under_the_current_policy():
    """A tolerance change must also refresh it (`pytest --parity-update-baseline` in the example)."""
    baseline = load_baseline(EXAMPLE_BASELINE)
    assert baseline.policy_hash == load_policy().digest, (
        "tolerances.toml changed since examples/external_kernel/baselines/my_mhc.csv was written: "
        "run `pytest --parity-update-baseline` in a copy of the example and commit its baseline"
    )
    assert baseline.implementation == "my_mhc"
    assert set(baseline.frame["case"]) == {case.name for case in registry.default_registry().select(suite="smoke")}
    assert set(baseline.frame["verdict"]) == {"pass"}


def test_the_example_baseline_is_of_the_current_format():
    """Reproduction (issue 68): the example's committed baseline was format 3, so every `pytest`
    there (the first thing its README runs) said to regenerate it."""
    header = parse_header(EXAMPLE_BASELINE.read_text(encoding="utf-8").partition("\n")[0])
    assert header is not None and header["format"] == str(BASELINE_FORMAT_VERSION), (
        "examples/external_kernel/baselines/my_mhc.csv is of an older format: run `pytest "
        "--parity-update-baseline` in the example and commit its baseline"
    )
    assert load_baseline(EXAMPLE_BASELINE).note == ""  # read without a legacy note


# The baselines made on the lent TPU v5e (bench/tpu_gate_check.sh, bench/tpu_maxtext_check.sh): what
# `make parity` and `make parity-maxtext` gate against on a TPU host. Only the chip can remake them.
CHIP_BASELINES = {
    "tpu-v5e.csv": ("default", {"pass", "skip", "unsupported"}),
    "tpu-v5e-maxtext-fixed.csv": ("maxtext", {"pass", "skip", "unsupported"}),
    # the released MaxText variants fail and error on the chip (docs/results/maxtext-tpu-v5e.md)
    "tpu-v5e-maxtext.csv": ("maxtext", {"pass", "skip", "unsupported", "fail", "error"}),
    # the `tpu` suite's eight shards, merged (bench/tpu_suite_check.sh merge)
    "tpu-v5e-tpu.csv": ("tpu", {"pass", "skip", "unsupported"}),
}


@pytest.mark.parametrize("name", sorted(CHIP_BASELINES))
def test_the_chip_baselines_are_whole_and_made_under_the_current_policy(name):
    """A tolerance change makes every TPU baseline unusable there (the gate refuses a policy
    mismatch): this fails first, here, so the change comes with a chip run to remake them."""
    baseline = load_baseline(ROOT / "baselines" / name)
    suite, verdicts = CHIP_BASELINES[name]
    assert baseline.policy_hash == load_policy().digest, (
        f"tolerances.toml changed since baselines/{name} was made on the TPU v5e: remake it there "
        "(bench/tpu_gate_check.sh default, bench/tpu_maxtext_check.sh run|fixed, bench/tpu_suite_check.sh)"
    )
    assert baseline.environment.get("backend") == "tpu" and baseline.suite == suite
    assert set(baseline.frame["verdict"]) <= verdicts


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
    with pytest.raises(ReportInputError, match=r"line 3: 10 fields, the baseline's columns are 16"):
        load_baseline(_edited_baseline(tmp_path, lambda columns, fields: fields[:10]))


def test_the_gate_exits_2_on_such_a_baseline(tmp_path):
    from mhc_parity.reports.samples import write_sample_run
    from tests.cli_support import run_cli

    write_sample_run([], tmp_path / "run", rendered=False)
    baseline = _edited_baseline(tmp_path, lambda columns, fields: fields[:10])
    result = run_cli("gate", "--baseline", baseline, "--current", tmp_path / "run")
    assert result.returncode == 2 and "10 fields" in result.stderr, result.stderr[-2000:]


def test_a_baseline_cut_at_a_row_boundary_is_refused(tmp_path):
    lines = BASELINE.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.csv"
    cut.write_text("".join(lines[: len(lines) // 2]))
    with pytest.raises(ReportInputError, match=r"the header records 1832 rows, the file holds"):
        load_baseline(cut)


def test_a_hand_edited_baseline_is_refused(tmp_path):
    def times_1000(columns, fields):
        column = columns.index("cand_oracle_max_err")
        fields[column] = repr(float(fields[column]) * 1000)
        return fields

    with pytest.raises(ReportInputError, match="does not match the header's digest"):
        load_baseline(_edited_baseline(tmp_path, times_1000))


def test_a_failed_write_leaves_the_old_baseline_whole(tmp_path):
    """Under a file-size limit the write fails, and the good baseline is still there."""
    import shutil
    import subprocess
    import sys

    target = tmp_path / "baseline.csv"
    shutil.copy(BASELINE, target)
    code = (
        "import resource, signal, sys\n"
        "from mhc_parity.reports.gate.baseline_file import load_baseline, write_baseline\n"
        "baseline = load_baseline(sys.argv[1])\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "write_baseline(baseline, sys.argv[1])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(target)],
        capture_output=True,
        text=True,
        cwd=BASELINE.parent.parent,
        timeout=120,
    )
    assert result.returncode != 0 and "File too large" in result.stderr, result.stderr[-1000:]
    assert target.read_bytes() == BASELINE.read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name != target.name]  # no temporary file left behind
    assert len(load_baseline(target).frame) == 1832
