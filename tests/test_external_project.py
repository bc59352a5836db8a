"""examples/external_kernel as a user's repository: copied to a temporary folder outside
the checkout and tested there with pytest, using only the documented lines.

mhc-parity is installed in this project's venv (`make setup`: pip install -e, so its
packages resolve through the installed distribution, not through the checkout being on
sys.path; the `pytest11` entry point comes from that installation). Each pytest run is
a subprocess started in the copy, whose sys.path holds the copy and site-packages only.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from reports import load_baseline, load_run

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "external_kernel"
CASES = ("lite-n4-c128-b2s64-f32-w32-identity-default", "lite-n4-c128-b2s64-f32-w32-mlp-default")
# A change to the kernel that scales `out` by 1 + 2**-12: far outside float32 parity.
BROKEN_MODULE = """
import dataclasses
from my_mhc.kernel import EinsumResidualMix


@dataclasses.dataclass(frozen=True)
class ScaledOutput(EinsumResidualMix):
    def post(self, layer_output, context, *, config):
        return super().post(layer_output, context, config=config) * (1 + 2.0**-12)


def factory():
    return ScaledOutput()
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("user-repo") / "my-mhc"
    shutil.copytree(EXAMPLE, folder)
    assert ROOT not in folder.resolve().parents
    (folder / "my_mhc" / "broken.py").write_text(BROKEN_MODULE)
    return folder


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS", "MHC_PARITY_SUITE")}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _pytest(project: pathlib.Path, *args: str, select: bool = True) -> subprocess.CompletedProcess:
    """pytest in the project, on the parity tests of CASES (all tests without `select`)."""
    selection = ["-k", " or ".join(CASES)] if select else []
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *selection, *args]
    return subprocess.run(command, cwd=project, env=_env(), capture_output=True, text=True, timeout=900)


def test_the_copy_sees_the_installed_package_not_the_checkout(project):
    code = "import json, sys, harness.pytest_plugin; print(json.dumps(sys.path))"
    found = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=_env(), capture_output=True, text=True, check=True
    ).stdout
    assert str(ROOT) not in json.loads(found)  # harness comes from the installed distribution
    assert (
        subprocess.run(
            [sys.executable, "-c", "import tests.external_impls"], cwd=project, env=_env(), capture_output=True
        ).returncode
        != 0
    )


def test_the_plugin_is_the_installed_entry_point_registered_once(request):
    import harness.pytest_plugin as plugin

    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert names.get("harness.pytest_plugin") == "harness.pytest_plugin"
    manager = request.config.pluginmanager
    registered = [name for name, p in manager.list_name_plugin() if p is plugin]
    assert registered == ["harness.pytest_plugin"]  # the conftest.py line did not register it again


def test_without_an_implementation_the_plugin_is_off(project):
    proc = _pytest(project, "-o", "parity_impl=", "-o", "parity_baseline=", "-rs", select=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 skipped" in proc.stdout and "no implementation to check" in proc.stdout


@pytest.mark.slow
def test_the_baseline_loop_in_a_user_repository(project):
    report = project / "out" / "parity"
    # First run: no baseline yet; two cases on two xdist workers; the controller writes the reports.
    first = _pytest(
        project, "-n", "2", "--dist", "loadscope", "-o", "parity_baseline=", "--parity-report", "out/parity"
    )
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert "4 passed" in first.stdout  # 2 cases x (vs_oracle, vs_reference)
    run = load_run(report)
    assert set(run.frame["case"]) == set(CASES)
    assert {"my_mhc/unsharded", "reference/unsharded"} == set(run.frame["candidate"])
    assert all((report / name).is_file() for name in ("report.html", "rows.csv", "summary.md", "manifest.json"))

    # Review, then commit the implementation's baseline (keyed by its name).
    made = subprocess.run(
        [sys.executable, "-m", "harness", "baseline", "--from", "out/parity", "--impl", "my_mhc"],
        cwd=project,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    assert load_baseline(project / "baselines" / "my_mhc.csv").implementation == "my_mhc"

    # Every later run is gated on the committed baseline (the pyproject's parity_baseline).
    gated = _pytest(project)
    assert gated.returncode == 0, gated.stdout[-4000:] + gated.stderr[-2000:]
    assert "gate PASS" in gated.stdout

    # A broken change of the kernel (same name): failing tests print the leaf table, and the gate fails.
    broken = _pytest(project, "--parity-impl", "my_mhc.broken:factory")
    assert broken.returncode == 1, broken.stdout[-4000:]
    assert "rows of lite-n4-c128-b2s64-f32-w32-identity-default::vs_oracle failed" in broken.stdout
    assert "verdict" in broken.stdout and "my_mhc/unsharded vs oracle" in broken.stdout
    assert "gate FAIL" in broken.stdout and "regression" in broken.stdout


def test_the_options_select_the_suite_and_dtype_with_case_and_comparison_ids(project):
    proc = _pytest(project, "--collect-only", "--parity-suite", "smoke", "--parity-dtype", "bf16", select=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if "::test_parity[" in line]
    assert ids and all("-bf16-" in line for line in ids)
    assert {line.rsplit("::", 1)[1].rstrip("]") for line in ids} == {"vs_oracle", "vs_reference"}


def test_a_bad_implementation_spec_is_a_one_line_usage_error(project):
    proc = _pytest(project, "--parity-impl", "my_mhc.kernel:no_such_factory")
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR
    assert "mhc-parity: --impl 'my_mhc.kernel:no_such_factory': my_mhc.kernel has no callable" in proc.stderr
    assert "Traceback" not in proc.stderr
