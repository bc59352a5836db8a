"""What `make parity` and `make baseline` run (`make -n`: printed, not run).

`make parity` judges the default suite against the committed baseline of the default suite,
so a leaf grown inside its bound shows on the report's first screen and fails the run; a
run of another suite gets no foreign baseline (every row would be missing or new), unless
BASELINE names one on the command line. `make baseline` runs without the old baseline: after
a deliberate numerical change its drift must not stop its own replacement.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.cli_support import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned_run(*arguments: str, target: str = "parity") -> str:
    """The `mhc-parity run` command line `make -n TARGET ARGUMENTS` prints (SUITE and BASELINE
    taken from the arguments only, not from this process's environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SUITE", "BASELINE", "OUT", "JOBS")}
    printed = subprocess.run(
        ["make", "-n", target, *arguments], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert printed.returncode == 0, printed.stderr
    (line,) = [line for line in printed.stdout.splitlines() if " run " in line and "mhc-parity" in line]
    assert line.startswith(".venv/bin/mhc-parity run "), line  # the documented command, the console script
    return line


def test_make_parity_judges_the_default_suite_against_the_committed_baseline():
    assert (ROOT / "baselines" / "default.csv").is_file()
    assert planned_run().endswith("--suite default --out out/parity --jobs auto --baseline baselines/default.csv")
    assert planned_run("SUITE=default").endswith("--baseline baselines/default.csv")


def test_another_suite_gets_no_foreign_baseline_unless_one_is_named():
    assert "--baseline" not in planned_run("SUITE=smoke")
    assert planned_run("SUITE=smoke", "BASELINE=baselines/smoke.csv").endswith("--baseline baselines/smoke.csv")


def test_make_baseline_runs_without_the_old_baseline():
    line = planned_run(target="baseline")
    assert "--suite default" in line and "--baseline" not in line
