"""`run --only-current-cases`: a run of part of a baseline's cases, chosen by suite, gated on
the baseline's rows of the cases it ran (what `make smoke` does against the default baseline).

Before it, a run selected by suite alone (`--suite smoke` against baselines/default.csv) failed
on every other baseline case as missing rows (1319), while `--cases X` gated only its cases.
The gate's other direction is untouched: without the option such a run still fails.
"""

from __future__ import annotations

from tests.test_run_exit_codes import mhc_parity

# Two cheap cases; the second file holds the first alone, as the smoke suite holds part of the default one.
TWO = """
[defaults]
batch = 1
sequence = 16
streams = 2
embedding = 128
dtype = "float32"

[[case]]
name = "loop-a-f32"

[[case]]
name = "loop-b-bf16"
dtype = "bf16"
"""
ONE = TWO.split("[[case]]")[0] + "[[case]]" + TWO.split("[[case]]")[1]
CHEAP = ("--suite", "user", "--paths", "reference/*", "--no-lowering", "--quiet")


def test_a_suite_run_is_gated_on_the_baselines_rows_of_its_own_cases(tmp_path):
    (tmp_path / "two.toml").write_text(TWO)
    (tmp_path / "one.toml").write_text(ONE)
    made = mhc_parity("run", "--case-file", tmp_path / "two.toml", *CHEAP, "--out", tmp_path / "both")
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    stored = mhc_parity("baseline", "--from", tmp_path / "both", "--to", tmp_path / "baseline.csv")
    assert stored.returncode == 0, stored.stderr[-3000:]
    part = ("run", "--case-file", tmp_path / "one.toml", *CHEAP, "--baseline", tmp_path / "baseline.csv")
    whole = mhc_parity(*part, "--out", tmp_path / "whole")
    assert whole.returncode == 1 and "missing" in whole.stdout, whole.stdout[-3000:] + whole.stderr[-3000:]
    own = mhc_parity(*part, "--only-current-cases", "--out", tmp_path / "own")
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr[-3000:]
    assert "PASS" in own.stdout and "gating only the current run's cases: 1 of 2 baseline cases" in own.stdout
