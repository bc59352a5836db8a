"""examples/external_kernel as a user's repository: copied to a temporary folder outside
the checkout and tested there with pytest, using only the documented lines: its README's two
commands install it and mhc-parity into a new virtual environment and pass there; it passes as
shipped (gated on its committed baseline), and the baseline loop works there (a missing
baseline is one usage error naming the command that writes it, `--parity-update-baseline`
writes it, a regression fails its test naming the leaf, the growth and the bound).

The README's commands run in a scratch venv (`tests.scratch_venv`: this venv's packages but
mhc-parity, which they install from a copy of the checkout). The other tests use mhc-parity as
installed in this project's venv (`make setup`: pip install -e, so its packages resolve
through the installed distribution, not through the checkout being on sys.path; the
`pytest11` entry point comes from that installation). Each pytest run is a subprocess
started in the copy, whose sys.path holds the copy and site-packages only.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from mhc_parity.reports import load_baseline, load_run
from tests import scratch_venv

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "external_kernel"
# The README section whose sh block is the two commands a copy is installed and tested with.
README_SECTION = "## Install and test"
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
# A drift of `out` uncorrelated with its value: each element moved by 3 * 2**-22 of its
# magnitude with a sign alternating along C, less its component along `out` (so no coherent
# scale, which the gain criterion fails in judging), forward only: inside the float32
# policy's bounds vs the oracle, but about 3x the error of the baseline's rows (above its
# noise floor), which only the gate's growth rule catches.
DRIFTED_MODULE = """
import dataclasses

import jax
import jax.numpy as jnp

from my_mhc.kernel import EinsumResidualMix


@dataclasses.dataclass(frozen=True)
class DriftedOutput(EinsumResidualMix):
    def post(self, layer_output, context, *, config):
        out = super().post(layer_output, context, config=config)
        o = out.astype(jnp.float32)
        sign = jnp.where(jnp.arange(o.shape[-1]) % 2 == 0, 1.0, -1.0).astype(jnp.float32)
        d = 3 * 2.0**-22 * sign * jnp.abs(o)
        d = d - jnp.sum(d * o) / jnp.maximum(jnp.sum(o * o), jnp.finfo(jnp.float32).tiny) * o
        return (o + jax.lax.stop_gradient(d)).astype(out.dtype)


def factory():
    return DriftedOutput()
"""
MISSING = "mhc-parity: baseline baselines/my_mhc.csv does not exist; create it with: pytest --parity-update-baseline"


def _copy(folder: pathlib.Path) -> pathlib.Path:
    """The example as a user's repository in `folder`, with the broken and drifted kernels beside its own."""
    shutil.copytree(EXAMPLE, folder)
    assert ROOT not in folder.resolve().parents
    (folder / "my_mhc" / "broken.py").write_text(BROKEN_MODULE)
    (folder / "my_mhc" / "drifted.py").write_text(DRIFTED_MODULE)
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> pathlib.Path:
    """The example as shipped (tests that change its files use `fresh_project`)."""
    return _copy(tmp_path_factory.mktemp("user-repo") / "my-mhc")


@pytest.fixture
def fresh_project(project) -> pathlib.Path:
    """The example as shipped at `project`'s own path, for a test that changes its files; put
    back as shipped after it. The same path, because an external implementation's stored
    programs and comparisons are keyed by its files' paths: what the tests before it computed
    for the kernel there is loaded, not computed again (the tests of this module run one after
    another in one process, xdist's loadscope included)."""
    _recopy(project)
    yield project
    _recopy(project)


def _recopy(folder: pathlib.Path) -> None:
    shutil.rmtree(folder)
    _copy(folder)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS", "MHC_PARITY_SUITE")}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def _pytest(project: pathlib.Path, *args: str, select: bool = True, command=("pytest",)) -> subprocess.CompletedProcess:
    """pytest in the project, on the parity tests of CASES (all tests without `select`);
    `command`: the words a message gave, "pytest" first, run with this interpreter."""
    selection = ["-k", " or ".join(CASES)] if select else []
    words = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *command[1:], *selection, *args]
    return subprocess.run(words, cwd=project, env=_env(), capture_output=True, text=True, timeout=900)


def _output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-6000:] + proc.stderr[-3000:]


def _verdict(proc: subprocess.CompletedProcess) -> str:
    """pytest's last summary line; it must agree with the exit status (never "passed" alone with a failure)."""
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    failed = "failed" in last or "error" in last
    if proc.returncode == pytest.ExitCode.OK:
        assert " passed" in last and not failed, _output(proc)
    elif proc.returncode == pytest.ExitCode.USAGE_ERROR:
        assert " passed" not in proc.stdout, _output(proc)
    else:
        assert failed, _output(proc)
    return last


def _failures(proc: subprocess.CompletedProcess) -> str:
    """pytest's FAILURES section: the tests' own messages, before the plugin's summary section."""
    return proc.stdout.partition(" FAILURES ===")[2].partition(" mhc-parity ===")[0]


def test_the_copy_sees_the_installed_package_not_the_checkout(project):
    code = "import json, sys, mhc_parity.harness.pytest_plugin; print(json.dumps(sys.path))"
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


def readme_commands() -> tuple[str, str]:
    """The example README's install and test commands: the sh block of its README_SECTION."""
    text = (EXAMPLE / "README.md").read_text(encoding="utf-8").partition(README_SECTION + "\n")[2]
    block = re.search(r"^```sh\n(.*?)^```", text, flags=re.M | re.S)
    assert block, f"examples/external_kernel/README.md has no sh block under {README_SECTION!r}"
    install, test = block.group(1).splitlines()
    return install, test


# What the scratch venv says of its mhc-parity: where its distribution and pytest11 entry point are.
WHERE_CODE = """
import importlib.metadata as m, json
(plugin,) = [e for e in m.entry_points(group="pytest11") if e.dist.name == "mhc-parity"]
print(json.dumps([str(m.distribution("mhc-parity").locate_file("")), plugin.load().__file__]))
"""


@pytest.mark.slow  # about 30 s: two builds (pip's build isolation) and a pytest that loads JAX
def test_the_readme_s_two_commands_install_a_copy_in_a_new_venv_and_pass_there(tmp_path):
    """The README's commands, word for word, in a copy of the example outside the checkout:
    `pip install "$MHC_PARITY" -e '.[test]'` with MHC_PARITY a copy of this checkout, then
    `pytest` (on one case, to keep this quick). The scratch venv has no mhc-parity but the one
    the first command installs: its CLI, its distribution and its pytest plugin are there."""
    install, test = readme_commands()
    assert install.startswith("pip install ") and "$MHC_PARITY" in install and test.split()[0] == "pytest"
    venv = scratch_venv.create(tmp_path / "venv", replacing=("mhc-parity",))
    source = scratch_venv.source_copy(ROOT, tmp_path / "mhc-parity")
    project = tmp_path / "my-mhc"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns(*scratch_venv.BUILD_OUTPUTS))

    installed = venv.run(install, project, MHC_PARITY=str(source))
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = venv.run(f"python -c '{WHERE_CODE}'", project)
    assert where.returncode == 0, where.stderr[-3000:]
    distribution, plugin = map(pathlib.Path, json.loads(where.stdout))
    assert distribution == venv.site_packages and plugin.is_relative_to(venv.site_packages)
    version = venv.run("mhc-parity --version", project)
    ours = importlib.metadata.version("mhc-parity")
    assert version.returncode == 0 and ours in version.stdout, version.stdout + version.stderr

    passed = venv.run(f"{test} -p no:cacheprovider -k {CASES[0]}", project)
    assert passed.returncode == 0, _output(passed)
    assert "2 passed" in _verdict(passed)  # one case x (vs_oracle, vs_reference)
    gated = r"mhc-parity: gate against baselines/my_mhc.csv: 2 tests gated, \d+ rows matched, 0 failing findings"
    assert re.search(gated, passed.stdout), _output(passed)


def test_the_plugin_is_the_installed_entry_point_registered_once(request):
    import mhc_parity.harness.pytest_plugin as plugin

    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert names.get("mhc_parity.harness.pytest_plugin") == "mhc_parity.harness.pytest_plugin"
    manager = request.config.pluginmanager
    registered = [name for name, p in manager.list_name_plugin() if p is plugin]
    assert registered == ["mhc_parity.harness.pytest_plugin"]  # the conftest.py line did not register it again


def test_without_an_implementation_the_plugin_is_off(project):
    proc = _pytest(project, "-o", "parity_impl=", "-o", "parity_baseline=", "-rs", select=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 skipped" in proc.stdout and "no implementation to check" in proc.stdout


def test_the_example_passes_as_shipped_gated_on_its_committed_baseline(project):
    proc = _pytest(project)
    assert proc.returncode == 0, _output(proc)
    assert "4 passed" in _verdict(proc)  # 2 cases x (vs_oracle, vs_reference)
    gated = "mhc-parity: gate against baselines/my_mhc.csv: 4 tests gated, 72 rows matched, 0 failing findings"
    assert gated in proc.stdout
    assert "error" not in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def unbaselined(tmp_path_factory) -> tuple[pathlib.Path, subprocess.CompletedProcess]:
    """A copy of the example without its baseline, and the plain pytest run there (which
    stops: the usage error naming the command that writes it). Shared by the tests that
    read that message; they write nothing into the copy (the baseline loop writes its
    baseline into its own `fresh_project`)."""
    project = _copy(tmp_path_factory.mktemp("unbaselined") / "my-mhc")
    (project / "baselines" / "my_mhc.csv").unlink()
    return project, _pytest(project)


def test_without_its_baseline_pytest_stops_with_one_line_naming_the_command(unbaselined):
    project, proc = unbaselined
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, _output(proc)
    _verdict(proc)
    assert proc.stderr.strip() == f"ERROR: {MISSING}"
    # The command carries the parity options and ini overrides the run was given.
    elsewhere = _pytest(project, "--parity-baseline", "mine/b.csv", "-o", "parity_dtype=f32")
    assert elsewhere.returncode == pytest.ExitCode.USAGE_ERROR, _output(elsewhere)
    assert elsewhere.stderr.strip() == (
        "ERROR: mhc-parity: baseline mine/b.csv does not exist; create it with: "
        "pytest --parity-baseline=mine/b.csv -o parity_dtype=f32 --parity-update-baseline"
    )


def _command_of(proc: subprocess.CompletedProcess) -> list[str]:
    """The command a missing-baseline message names."""
    return shlex.split(proc.stderr.strip().partition("create it with: ")[2])


@pytest.mark.slow
def test_the_baseline_loop_in_a_user_repository(fresh_project, unbaselined):
    project, baseline = fresh_project, fresh_project / "baselines" / "my_mhc.csv"
    baseline.unlink()
    # The plain run in a copy without its baseline (the same files as this one now): its
    # message, shared with the test above, names the command to run here.
    _, missing = unbaselined
    assert missing.returncode == pytest.ExitCode.USAGE_ERROR and MISSING in missing.stderr, _output(missing)

    # The command it names writes the baseline: here on two xdist workers, written once by
    # the controller from both workers' rows, with the run folder beside it.
    report = project / "out" / "parity"
    made = _pytest(
        project, "-n", "2", "--dist", "loadscope", "--parity-report", "out/parity", command=_command_of(missing)
    )
    assert made.returncode == 0, _output(made)
    assert "4 passed" in _verdict(made)
    created = "mhc-parity: created baseline baselines/my_mhc.csv: 72 rows of implementation 'my_mhc' in 2 cases"
    assert created in made.stdout
    written = load_baseline(baseline)
    assert written.implementation == "my_mhc" and set(written.frame["case"]) == set(CASES)
    assert set(load_run(report).frame["case"]) == set(CASES)
    assert all((report / name).is_file() for name in ("report.html", "rows.csv", "summary.md", "manifest.json"))

    # Every later run is gated on it (the pyproject's parity_baseline); an update without a change says so.
    gated = _pytest(project)
    assert gated.returncode == 0, _output(gated)
    assert "4 passed" in _verdict(gated) and "4 tests gated, 72 rows matched, 0 failing findings" in gated.stdout
    again = _pytest(project, "--parity-update-baseline", "-k", CASES[1], select=False)
    assert again.returncode == 0, _output(again)
    assert "mhc-parity: baseline baselines/my_mhc.csv is up to date (72 rows" in again.stdout
    assert "kept the rows of 1 case this session did not run" in again.stdout

    # A broken change of the kernel (same name): one failure per case, not one per comparison
    # (its leaves fail against the oracle and the reference alike): the vs_oracle test's
    # message has both comparisons' failing rows and the gate's findings (the leaf, its
    # growth and the allowed growth); the vs_reference test is skipped, naming it.
    # On CASES[0] alone (every message checked names it): one case's two comparisons show
    # one failure per case as well as two cases do, and each failing case costs the cause
    # analysis of its failing leaves (most of this run's time).
    broken = _pytest(project, "--parity-impl", "my_mhc.broken:factory", "-rs", "-k", CASES[0], select=False)
    assert broken.returncode == pytest.ExitCode.TESTS_FAILED, _output(broken)
    assert "1 failed, 1 skipped" in _verdict(broken)
    failures = _failures(broken)
    assert re.search(rf"{CASES[0]}::vs_oracle: \d+ leaves failed, seen by vs_oracle and vs_reference", failures)
    assert re.search(rf"\d+ failing rows of {CASES[0]} \(\d+ of \d+ vs_oracle, \d+ of \d+ vs_reference\)", failures)
    assert f"{CASES[0]}::vs_oracle: gate FAIL against baselines/my_mhc.csv" in failures
    for comparison, partner in (("vs_oracle", "oracle"), ("vs_reference", "reference/unsharded")):
        # A systematic shift along the leaf is named first where the gate's gain rule saw one.
        finding = rf"regression +out +my_mhc/unsharded +{comparison} +{partner} +(systematic: [^;]*; )?"
        finding += r"max \S+ -> \S+ \(x[0-9.e+]+\); rms "
        finding += r".* > allowed x2"
        assert re.search(finding, failures), failures[-3000:]
    assert f"{CASES[0]}::vs_reference: its failing leaves are reported by {CASES[0]}::vs_oracle" in broken.stdout
    assert "mhc-parity: 1 parity test skipped: each leaf failing there fails the first selected test" in broken.stdout

    # Refreshing the baseline from it names what changed, warns, and its tests still fail.
    refresh = ("--parity-impl", "my_mhc.broken:factory", "--parity-update-baseline", "-k", CASES[0])
    refreshed = _pytest(project, *refresh, select=False)
    assert refreshed.returncode == pytest.ExitCode.TESTS_FAILED, _output(refreshed)
    assert "1 failed, 1 skipped" in _verdict(refreshed)
    updated = r"mhc-parity: updated baseline baselines/my_mhc.csv: 0 rows added, 0 removed, \d+ changed"
    assert re.search(updated, refreshed.stdout)
    assert re.search(r"changed: \S+::\S+ \(my_mhc/unsharded vs oracle\): verdict pass -> fail", refreshed.stdout)
    assert re.search(r"mhc-parity: warning: \d+ rows are fail/error; the gate fails on them", refreshed.stdout)


@pytest.mark.slow
def test_a_drift_inside_the_policy_fails_its_test_naming_leaf_growth_and_bound(project):
    """Rows that pass the policy against the oracle but grew past the gate's factor: the
    test fails (it did not before). Its message has every comparison that saw those leaves,
    the deselected vs_reference test's too (the gate's findings there, and its rows, which
    fail against the reference)."""
    proc = _pytest(project, "--parity-impl", "my_mhc.drifted:factory", "-k", f"{CASES[0]} and vs_oracle", select=False)
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, _output(proc)
    assert "1 failed" in _verdict(proc)
    failures = _failures(proc)
    assert not re.search(r"\d+ of \d+ vs_oracle", failures)  # every vs_oracle row is inside the policy's bounds
    headline = rf"{CASES[0]}::vs_oracle: gate FAIL against baselines/my_mhc.csv: "
    assert re.search(headline + r"leaf \S+ \(my_mhc/unsharded vs oracle\) grew x[0-9.]+ > allowed x2", failures)
    shift = r"(systematic: [^;]*; )?"
    assert re.search(
        r"regression +out +my_mhc/unsharded +vs_oracle +oracle +" + shift + r"max .* > allowed x2", failures
    )
    assert re.search(
        r"regression +out +my_mhc/unsharded +vs_reference +reference/unsharded +" + shift + "max .*", failures
    )


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
