"""What `make parity`, `make baseline` and the other targets run (`make -n`: printed, not run).

`make parity` judges the default suite against the committed baseline of the default suite,
so a leaf grown inside its bound shows on the report's first screen and fails the run; a
run of another suite gets no foreign baseline (every row would be missing or new), unless
BASELINE names one on the command line. `make baseline` runs without the old baseline: after
a deliberate numerical change its drift must not stop its own replacement.

The variables that choose what runs or where it is written are make's command line's only:
one exported in the shell (for another tool, or left from an earlier session) is dropped
with a warning, so it neither changes the suite, drops the gate, redirects the output, nor
makes `make baseline` write another suite's rows over the default suite's baseline.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest

from tests.cli_support import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")

# The Makefile's variables that select what runs or where its results go (COMMAND_LINE_ONLY).
COMMAND_LINE_ONLY = (
    "SUITE",
    "BASELINE",
    "IMPL",
    "OUT",
    "MAXTEXT",
    "MAXTEXT_OUT",
    "FAULTS_OUT",
    "SWEEP_OUT",
    "RESULTS",
    "SEEDS",
    "PYTEST_ARGS",
)
# The default suite's reviewed baseline, as the Makefile picks it (a TPU VM's chips: its own).
DEFAULT_BASELINE = (
    "baselines/tpu-v5e.csv" if glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*") else "baselines/default.csv"
)


def make_n(target: str, *arguments: str, environment: dict | None = None) -> subprocess.CompletedProcess:
    """`make -n TARGET ARGUMENTS` (printed, never run), with none of the Makefile's variables in
    its environment but those of `environment`."""
    env = {k: v for k, v in os.environ.items() if k not in (*COMMAND_LINE_ONLY, "JOBS", "MAKEFLAGS")}
    env.update(environment or {})
    return subprocess.run(
        ["make", "-n", target, *arguments], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def printed_lines(printed: subprocess.CompletedProcess) -> list[str]:
    """The command lines `make -n` printed, a recipe line continued with a backslash joined up."""
    return re.sub(r" ?\\\n\s*", " ", printed.stdout).splitlines()


def planned_commands(target: str, *arguments: str, environment: dict | None = None) -> list[str]:
    """The commands `make -n TARGET` prints that call the installed mhc-parity, python or pytest
    (the set-up's lines left out), each without the `|| { ... }` that explains an exit 2."""
    printed = make_n(target, *arguments, environment=environment)
    assert printed.returncode == 0, printed.stderr
    lines = [line.split(" || ")[0] for line in printed_lines(printed)]
    return [line for line in lines if line.startswith((".venv/bin/mhc-parity ", ".venv/bin/python -m pytest"))]


def planned_run(*arguments: str, target: str = "parity", environment: dict | None = None) -> str:
    """The `mhc-parity run` command line `make -n TARGET ARGUMENTS` prints (SUITE and BASELINE
    taken from the arguments only, not from this process's environment)."""
    (line,) = [c for c in planned_commands(target, *arguments, environment=environment) if " run " in c]
    assert line.startswith(".venv/bin/mhc-parity run "), line  # the documented command, the console script
    return line


def test_make_parity_judges_the_default_suite_against_the_committed_baseline():
    assert (ROOT / DEFAULT_BASELINE).is_file()
    assert planned_run().endswith(f"--suite default --out out/parity --jobs auto --baseline {DEFAULT_BASELINE}")
    assert planned_run("SUITE=default").endswith(f"--baseline {DEFAULT_BASELINE}")


def test_another_suite_gets_no_foreign_baseline_unless_one_is_named():
    assert "--baseline" not in planned_run("SUITE=full")
    assert planned_run("SUITE=full").endswith("--suite full --out out/full --jobs auto")
    assert planned_run("SUITE=smoke", "BASELINE=baselines/smoke.csv").endswith("--baseline baselines/smoke.csv")


def test_the_edit_loop_gates_the_smoke_suite_on_the_default_baselines_rows_of_its_cases_in_its_own_folder():
    """Reproduction (issue 68): `make parity SUITE=smoke` wrote over out/parity, after which `make
    gate` failed, and no variable passed --only-current-cases, so the smoke run against the
    default baseline failed on 1319 missing rows. The smoke suite is a subset of the default
    one: its run goes to out/smoke, gated on the default baseline's rows of the cases it ran."""
    smoke = f"--suite smoke --out out/smoke --jobs auto --baseline {DEFAULT_BASELINE} --only-current-cases"
    assert planned_run("SUITE=smoke").endswith(smoke)
    assert planned_run(target="smoke").endswith(smoke)
    assert planned_commands("gate", "SUITE=smoke") == [
        f".venv/bin/mhc-parity gate --baseline {DEFAULT_BASELINE} --current out/smoke --only-current-cases"
    ]
    assert planned_commands("gate") == [f".venv/bin/mhc-parity gate --baseline {DEFAULT_BASELINE} --current out/parity"]


def test_make_baseline_runs_without_the_old_baseline():
    line = planned_run(target="baseline")
    assert "--suite default" in line and "--baseline" not in line


# ----------------------------------------------------------------- variables from the environment


def test_an_exported_suite_neither_changes_the_suite_nor_drops_the_gate():
    """Reproduction: with SUITE=smoke exported, `make parity` ran the smoke suite without
    --baseline, and the gate was silently gone."""
    printed = make_n("parity", environment={"SUITE": "smoke"})
    assert printed.returncode == 0, printed.stderr
    (line,) = [line.split(" || ")[0] for line in printed_lines(printed) if " run --suite" in line]
    assert line.endswith(f"--suite default --out out/parity --jobs auto --baseline {DEFAULT_BASELINE}")
    assert "SUITE=smoke in the environment is ignored" in printed.stderr
    assert "make parity SUITE=smoke" in printed.stderr  # what to type instead


def test_an_exported_suite_does_not_make_make_baseline_overwrite_the_default_baseline():
    """Reproduction: with SUITE=smoke exported, `make baseline` wrote the smoke suite's rows
    over the default suite's baseline."""
    commands = planned_commands("baseline", environment={"SUITE": "smoke"})
    assert commands == [
        ".venv/bin/mhc-parity run --suite default --out out/parity --jobs auto",
        f".venv/bin/mhc-parity baseline --from out/parity --to {DEFAULT_BASELINE}",
    ]


def test_make_baseline_of_another_suite_needs_its_file_named_on_the_command_line():
    for arguments in (("SUITE=smoke",), ("SUITE=smoke", "IMPL=my_pkg.impl:factory")):
        refused = make_n("baseline", *arguments)
        assert refused.returncode == 2
        assert "would write the smoke suite's rows over the default suite's baseline" in refused.stderr
        assert "BASELINE=baselines/smoke" in refused.stderr
        assert "mhc-parity" not in refused.stdout  # nothing would run
    assert planned_commands("baseline", "SUITE=smoke", "BASELINE=baselines/smoke.csv") == [
        ".venv/bin/mhc-parity run --suite smoke --out out/smoke --jobs auto",
        ".venv/bin/mhc-parity baseline --from out/smoke --to baselines/smoke.csv",
    ]
    (line,) = planned_commands("baseline", "SUITE=smoke", "IMPL=m:f", "BASELINE=baselines/smoke-m.csv")
    assert line == ".venv/bin/mhc-parity baseline --impl m:f --suite smoke --out out/smoke --to baselines/smoke-m.csv"


def test_an_exported_impl_does_not_make_an_implementations_baseline():
    """Reproduction: an exported IMPL turned `make baseline` into an external implementation's baseline."""
    commands = planned_commands("baseline", environment={"IMPL": "my_pkg.impl:factory"})
    assert not any("--impl" in c for c in commands)
    assert commands[-1] == f".venv/bin/mhc-parity baseline --from out/parity --to {DEFAULT_BASELINE}"
    assert planned_commands("baseline", "IMPL=my_pkg.impl:factory") == [
        ".venv/bin/mhc-parity baseline --impl my_pkg.impl:factory --suite default --out out/parity"
    ]


def test_an_exported_out_does_not_redirect_make_parity(tmp_path):
    """Reproduction: an exported OUT redirected `make parity` into a folder of logs."""
    assert "--out out/parity " in planned_run(environment={"OUT": str(tmp_path)})
    assert f"--out {tmp_path} " in planned_run(f"OUT={tmp_path}")


def test_baseline_is_taken_from_the_command_line_alike_by_parity_gate_and_baseline():
    """Reproduction: an exported BASELINE was used by `make gate` and `make baseline` but not
    by `make parity`. Now the environment's is ignored by all three, the command line's
    honoured by all three."""
    exported = {"BASELINE": "baselines/elsewhere.csv"}
    assert planned_run(environment=exported).endswith(f"--baseline {DEFAULT_BASELINE}")
    assert planned_commands("gate", environment=exported) == [
        f".venv/bin/mhc-parity gate --baseline {DEFAULT_BASELINE} --current out/parity"
    ]
    assert planned_commands("baseline", environment=exported)[-1].endswith(f"--to {DEFAULT_BASELINE}")
    named = "BASELINE=baselines/elsewhere.csv"
    assert planned_run(named).endswith("--baseline baselines/elsewhere.csv")
    assert planned_commands("gate", named) == [
        ".venv/bin/mhc-parity gate --baseline baselines/elsewhere.csv --current out/parity"
    ]
    assert planned_commands("baseline", named)[-1].endswith("--to baselines/elsewhere.csv")


@pytest.mark.parametrize(
    ("target", "variable", "value", "default"),
    [
        ("parity-maxtext", "MAXTEXT", "fixed", "mhc_parity.maxtext_parity:implementations"),
        ("parity-maxtext", "MAXTEXT_OUT", "/tmp/elsewhere", "--out out/parity-maxtext "),
        ("faults", "FAULTS_OUT", "/tmp/elsewhere", "--out out/faults "),
        ("faults", "SUITE", "smoke", "--results docs/results/kill-matrix-default.md"),
        ("faults", "RESULTS", "/tmp/elsewhere", "--results docs/results/kill-matrix-default.md"),
        ("sweep", "SWEEP_OUT", "/tmp/elsewhere", "--out out/sweep "),
        ("sweep", "SEEDS", "3", "--seeds 50 "),
        ("test", "PYTEST_ARGS", "-k nothing", "-m pytest -n auto"),
    ],
)
def test_every_variable_of_what_runs_or_where_it_goes_ignores_the_environment(target, variable, value, default):
    printed = make_n(target, environment={variable: value})
    assert printed.returncode == 0, printed.stderr
    (line,) = [
        line
        for line in printed_lines(printed)
        if line.startswith((".venv/bin/mhc-parity", ".venv/bin/python -m pytest"))
    ]
    assert default in line and value not in line.split(" || ")[0], line
    assert f"{variable}={value} in the environment is ignored" in printed.stderr
    assert value in make_n(target, f"{variable}={value}").stdout  # the command line's is taken


def test_setting_up_says_nothing_of_the_environment():
    """CI exports OUT for its own steps and runs `make setup`: no warning there."""
    printed = make_n("print-venv", environment={"OUT": "out/parity-tpu", "SUITE": "smoke"})
    assert printed.returncode == 0 and "ignored" not in printed.stderr


# ------------------------------------------------------------------- an error naming --out


@pytest.mark.parametrize("code", [1, 2])
def test_a_usage_error_names_the_make_variables_behind_its_options(tmp_path, code):
    """`--out` in mhc-parity's error is the make user's OUT: an exit 2 says which variable gave
    which option, and keeps the exit code (make's own is 2 either way); a failing verdict
    (exit 1) does not. A stand-in for mhc-parity, and `-o setup` so that nothing is installed."""
    fake = tmp_path / "mhc-parity"
    fake.write_text(
        f'#!/bin/sh\necho "mhc-parity: error: --out: $5 holds files but no run manifest" >&2\nexit {code}\n'
    )
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in (*COMMAND_LINE_ONLY, "JOBS", "MAKEFLAGS")}
    finished = subprocess.run(
        ["make", "-o", "setup", "parity", f"MHC_PARITY={fake}", f"OUT={tmp_path / 'logs'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2
    assert f"--out: {tmp_path / 'logs'} holds files" in finished.stderr
    explained = "make parity: mhc-parity's options came from make's variables:" in finished.stderr
    assert explained == (code == 2)
    if code == 2:
        assert "--out is OUT" in finished.stderr and "--baseline is BASELINE" in finished.stderr
