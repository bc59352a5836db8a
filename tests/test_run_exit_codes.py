"""The exit codes of the `mhc-parity` command as CI sees them, measured through the console
script itself (the README's exit table is this command's; make turns any failing recipe into
its own exit 2, so CI that tells 1 from 2 calls the command directly).

    2  a usage error, before anything is computed or written;
    1  a parity failure (a fail row), and a leaf that grew past the gate's growth factor
       against `--baseline` while inside its bound: the run fails as `mhc-parity gate`
       fails it, and says so first;
    0  a run that passes, against a baseline of its own rows too.

The README's and docs/gate.md's CI recipes call the command, not make. The runs are the
cheapest the CLI tests use (tests/cli_support.py): two tiny cases through
the reference path, and one through a kernel that drops a factor (`tests.external_impls`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mhc_parity.reports import load_run, write_baseline
from tests.cli_support import BROKEN_IMPL_RUN, ROOT, TWO_CASES_REFERENCE_ONLY

COMMAND = Path(sys.executable).with_name("mhc-parity")  # the console script beside this Python


def mhc_parity(*arguments, environment: dict | None = None) -> subprocess.CompletedProcess:
    """`mhc-parity ARGUMENTS` from the project root, as CI runs it; this checkout's `tests`
    package importable (the console script does not put the working folder on sys.path);
    `environment`: variables set besides."""
    assert COMMAND.is_file(), f"{COMMAND}: the console script is not installed (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.update(environment or {})
    return subprocess.run(
        [str(COMMAND), *map(str, arguments)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "arguments, fragment",
    [(["--no-such-option"], "unrecognized arguments"), (["--suite", "no-such-suite"], "unknown suite")],
    ids=["unknown-option", "unknown-suite"],
)
def test_a_usage_error_exits_2_before_anything_is_written(tmp_path, arguments, fragment):
    out = tmp_path / "run"
    proc = mhc_parity("run", *arguments, "--out", out)
    assert proc.returncode == 2, proc.stderr[-3000:]
    # the last line names the problem (argparse puts the usage above it), never a traceback
    assert fragment in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "environment, fragment",
    [
        ({"JAX_PLATFORMS": "bogus"}, "JAX cannot start its backend (JAX_PLATFORMS='bogus'): Unable to initialize"),
        (
            {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
            "reference/sharded(data=2,fsdp=4) needs 8 devices; this process has 4 CPU devices",
        ),
    ],
    ids=["backend-that-cannot-start", "too-few-cpu-devices"],
)
def test_a_backend_or_device_count_the_process_lacks_exits_2_before_anything_is_written(
    tmp_path, environment, fragment
):
    """A backend JAX cannot start was a 60-line traceback and exit 1 (a parity failure's code)
    with the manifest left `running`; four simulated CPU devices turned each 8-device sharded
    path into a `skip` and the run passed on the rest. Both are usage errors, before the
    run folder exists."""
    out = tmp_path / "run"
    sharded = "lite-n4-c128-b2s256-f32-w32-identity-default-m2x4-bt64"
    proc = mhc_parity("run", "--cases", sharded, "--jobs", "1", "--quiet", "--out", out, environment=environment)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert fragment in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_a_parity_failure_exits_1(case_file, tmp_path):
    proc = mhc_parity(
        "run",
        "--case-file",
        case_file,
        *BROKEN_IMPL_RUN,
        # The exit code follows the verdicts, which the causes' search leaves as they are (and
        # which was most of this run's time).
        "--no-causes",
        "--out",
        tmp_path / "broken",
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "parity: FAIL" in proc.stdout


def cheap_run(case_file, out, *extra) -> subprocess.CompletedProcess:
    return mhc_parity("run", "--case-file", case_file, *TWO_CASES_REFERENCE_ONLY, "--out", out, *extra)


# The same cheap cases through an external implementation alone (its rows against the oracle),
# correct and after a change that moves `out` by 2**-20 of each element's magnitude with an
# alternating sign, uncorrelated with its value (no coherent scale, which the judging's gain
# criterion fails): 8 float32 ulps, inside its bounds against the oracle, past the rounding
# model's spread of two correct runs (which shrinking a baseline's number cannot fake: the
# spread is the larger sensitivity's), so only the gate catches it.
WRAPPED_PATHS = ("--paths", "wrapped_reference/*")
GOOD_IMPL = ("--impl", "tests.external_impls:good", *WRAPPED_PATHS)
DRIFTED_IMPL = ("--impl", "tests.external_impls:drifted", *WRAPPED_PATHS)


@pytest.fixture(scope="module")
def baselines(case_file, tmp_path_factory) -> dict:
    """A cheap run of the correct implementation and its own baseline ("clean"): against it,
    the drifted implementation's `out` grew 8 ulps, inside its bound."""
    root = tmp_path_factory.mktemp("exit-codes")
    made = cheap_run(case_file, root / "made", *GOOD_IMPL)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    return {"clean": write_baseline(load_run(root / "made"), root / "clean.csv")}


@pytest.mark.slow
def test_run_against_its_own_baseline_passes_and_says_so(case_file, baselines, tmp_path):
    proc = cheap_run(case_file, tmp_path / "run", *GOOD_IMPL, "--baseline", baselines["clean"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"Gate against {baselines['clean']}: PASS" in proc.stdout


@pytest.mark.slow
def test_a_leaf_grown_inside_its_bound_fails_the_run_as_the_gate_fails_it(case_file, baselines, tmp_path):
    out = tmp_path / "run"
    proc = cheap_run(case_file, out, *DRIFTED_IMPL, "--baseline", baselines["clean"])
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    leaf = "out"
    assert "parity: PASS" in proc.stdout  # every row inside its bound
    gate_lines = proc.stdout.split("parity: PASS", 1)[1]
    grew = re.search(
        rf"Gate against {re.escape(str(baselines['clean']))}: FAIL: (\d+) rows? grew more than ×2 or shifted "
        r"along the leaf, past the rounding spread",
        gate_lines,
    )
    assert grew, gate_lines
    assert leaf in gate_lines and "regression" in gate_lines
    banner = (out / "report.html").read_text().split("</header>", 1)[0]
    assert f"<b>{leaf}</b>" in banner and "grew more than ×2" in banner
    gate = mhc_parity("gate", "--baseline", baselines["clean"], "--current", out)
    assert gate.returncode == 1, gate.stdout[-3000:] + gate.stderr[-3000:]
    heading = f"regression ({grew.group(1)}):"
    assert heading in gate.stdout and leaf in gate.stdout.split(heading, 1)[1]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def test_the_documented_ci_recipes_call_the_command_and_say_what_make_does():
    """A CI recipe through make would read every failure as exit 2: the README's and
    docs/gate.md's recipes call `mhc-parity run` and `mhc-parity gate` themselves, run the
    gate whatever the run's code, and the README says what make does to the codes."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    gating = readme.split("## Gating a pull request", 1)[1].split("\n## ", 1)[0]
    guide = (ROOT / "docs" / "gate.md").read_text(encoding="utf-8")
    for text in (gating, guide):
        (recipe,) = [block for block in code_blocks(text) if "mhc-parity run" in block]
        assert "mhc-parity gate" in recipe and "make " not in recipe and "&&" not in recipe, recipe
    assert all("&& make gate" not in block for block in code_blocks(readme) + code_blocks(guide))
    assert "make exits 2" in " ".join(readme.split())
