"""The installed package in a user's repository that has its own `harness`, `cases`, `records`
and `reports` packages (issue 35): nothing collides.

Everything mhc-parity installs is the one package `mhc_parity`. This installs the checkout
(a copy of its sources, so the build writes nothing into the checkout) into a scratch
site folder, as pip installs it anywhere, and works in a scratch repository whose own
packages carry those four common names: there the `mhc-parity` console script prints its
version and runs one small case through the repository's own implementation (its module
imported from the working directory, as `python -m` would), and the pytest plugin checks the
same implementation on the same case. The repository's code imports its own packages
throughout, and `mhc_parity` is the installed copy's, not the checkout's (this venv's
editable install maps `mhc_parity` to the checkout; PYTHONPATH puts the site folder first).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from mhc_parity.records.project_code import NAMESPACE
from mhc_parity.version import version
from tests.cli_support import REFERENCE_ONLY_CASE, ROOT

# The bare `import harness` and the like below are the scratch repository's own packages, not
# this project's (namespace-rename: skip: a bulk rewrite of module names leaves this file alone).
# The scratch repository's own packages: the names a user's repository often has.
OWN_PACKAGES = ("harness", "cases", "records", "reports")
# Its implementation: this project's reference under another name, importing the repository's
# own packages (the import fails, and so does everything after it, if it gets ours instead).
IMPLEMENTATION = '''
"""The scratch repository's mHC: mhc-parity's reference, named "scratch"."""

import dataclasses

import cases
import harness
import records
import reports
from mhc_parity.mhc import reference

OWN = {module.__name__: module.MARKER for module in (harness, cases, records, reports)}
assert all(marker == f"scratch {name}" for name, marker in OWN.items()), OWN


@dataclasses.dataclass(frozen=True)
class Scratch:
    name: str = "scratch"

    def pre(self, x, weights, *, config):
        return reference.pre(x, weights, config=config)

    def post(self, layer_output, context, *, config):
        return reference.post(layer_output, context, config=config)


def factory():
    return Scratch()
'''
# Its test file: its own packages, then the plugin's parity tests.
TEST_FILE = """
import pathlib

import harness.marker
import reports
from mhc_parity.harness.pytest_plugin import check_parity

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent


def test_the_repository_s_own_packages_are_imported():
    assert harness.marker.WHERE == "scratch harness.marker" and reports.MARKER == "scratch reports"
    assert pathlib.Path(harness.__file__).resolve().parent.parent == REPOSITORY


def test_parity(parity_check):
    check_parity(parity_check)
"""
# What the repository's Python sees, run there: its own four packages and the installed mhc_parity.
WHAT_IS_IMPORTED = """
import json, cases, harness, records, reports, mhc_parity, mhc_parity.harness.cli
modules = (cases, harness, records, reports, mhc_parity, mhc_parity.harness.cli)
print(json.dumps({m.__name__: m.__file__ for m in modules}))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    """mhc-parity installed into a folder of its own (as `pip install` would anywhere), from a
    copy of the checkout's sources: the build's files land in the copy, not the checkout."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    shutil.copytree(ROOT / NAMESPACE, source / NAMESPACE, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    target = base / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    proc = subprocess.run([*pip, "--target", str(target), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (target / NAMESPACE / "__init__.py").is_file() and (target / "bin" / "mhc-parity").is_file()
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) == ["bin", NAMESPACE]
    return target


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> pathlib.Path:
    """A user's repository with its own `harness`, `cases`, `records` and `reports` packages,
    an implementation module at its root and a test file."""
    folder = tmp_path_factory.mktemp("user-repo") / "scratch"
    for name in OWN_PACKAGES:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f'MARKER = "scratch {name}"\n')
    (folder / "harness" / "marker.py").write_text('WHERE = "scratch harness.marker"\n')
    (folder / "scratch_impl.py").write_text(textwrap.dedent(IMPLEMENTATION))
    (folder / "tests").mkdir()
    (folder / "tests" / "test_scratch.py").write_text(textwrap.dedent(TEST_FILE))
    assert ROOT not in folder.resolve().parents
    return folder


def _run(words, repository: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
    """`words` run in `repository` with the installed copy first on the path (and no XLA flags,
    suite or xdist settings of this process)."""
    skip = ("XLA_FLAGS", "MHC_PARITY_SUITE", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env["PYTHONPATH"] = str(site)
    # The caches' default is `.cache` beside the package, here in the site folder: one of their own.
    env["MHC_PARITY_CACHE"] = str(site.parent / "cache")
    return subprocess.run(words, cwd=repository, env=env, capture_output=True, text=True, timeout=600)


def _output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-4000:] + proc.stderr[-4000:]


def test_the_repository_imports_its_own_packages_and_the_installed_mhc_parity(site, repository):
    proc = _run([sys.executable, "-c", WHAT_IS_IMPORTED], repository, site)
    assert proc.returncode == 0, _output(proc)
    files = {name: pathlib.Path(file).resolve() for name, file in json.loads(proc.stdout).items()}
    assert all(files[name].parent.parent == repository.resolve() for name in OWN_PACKAGES), files
    for name in (NAMESPACE, f"{NAMESPACE}.harness.cli"):
        assert files[name].is_relative_to(site.resolve()), f"{name} is not the installed copy's: {files[name]}"


def test_the_console_script_runs_a_case_through_the_repository_s_implementation(site, repository):
    command = str(site / "bin" / "mhc-parity")
    shown = _run([command, "--version"], repository, site)
    assert (shown.returncode, shown.stdout) == (0, f"mhc-parity {version()}\n"), _output(shown)

    out = repository / "out" / "cli"
    arguments = ["run", "--cases", REFERENCE_ONLY_CASE, "--impl", "scratch_impl:factory"]
    arguments += ["--paths", "reference/*", "scratch/*", "--no-lowering", "--quiet", "--jobs", "1", "--out", str(out)]
    proc = _run([command, *arguments], repository, site)
    assert proc.returncode == 0, _output(proc)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["state"] == "complete"
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    judged = {(row["candidate"], row["comparison"]) for row in rows if row["verdict"] == "pass"}
    assert {("scratch/unsharded", "vs_oracle"), ("scratch/unsharded", "vs_reference")} <= judged
    # The run records the repository's code it ran: the implementation and its own packages.
    recorded = set(manifest["code_files"])
    own = {str((repository / name / "__init__.py").resolve()) for name in OWN_PACKAGES}
    assert {str((repository / "scratch_impl.py").resolve())} | own <= recorded, sorted(recorded)


def test_the_pytest_plugin_checks_the_repository_s_implementation(site, repository):
    words = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/test_scratch.py"]
    words += ["--parity-impl", "scratch_impl:factory", "-k", f"own_packages or {REFERENCE_ONLY_CASE}"]
    proc = _run(words, repository, site)
    assert proc.returncode == 0, _output(proc)
    assert "3 passed" in proc.stdout.strip().splitlines()[-1], _output(proc)  # its own test + 2 comparisons
