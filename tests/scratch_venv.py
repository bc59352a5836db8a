"""A scratch virtual environment that reuses this interpreter's installed packages, for the
tests that install a project as its user does (`pip install`) and run it from a folder
outside the checkout: tests/test_external_project.py (the example's README commands) and
tests/test_maxtext_recipe.py (MaxText's own pytest gated by the plugin).

Its site-packages links every top-level entry of this interpreter's site-packages (jax,
pytest, ... as `make setup` installed them) except the files of the distributions the test
installs itself (mhc-parity, MaxText), so the copy a test installs is the only one there:
a `.pth` line naming the whole folder would also bring this venv's own editable mhc-parity
and its entry point. `pip` and `pytest` are console scripts in its `bin/`, as a venv with
them installed has. Installing passes `--no-deps` (PIP_NO_DEPS), so nothing is downloaded
but the build backend pip's build isolation takes from the package index (setuptools).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import venv

from mhc_parity.records.cache_root import cache_root

# What a checkout holds that is not its source: pip builds the copy, never these (a stale
# build/lib would be packed into the wheel).
BUILD_OUTPUTS = (".git", ".venv", ".cache", "out", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
# The variables of the test process that would reach into the scratch runs: the checkout on
# sys.path, the flags the outer session set, its suite, pytest-xdist's and pytest's own.
OUTER_VARIABLES = ("PYTHONPATH", "XLA_FLAGS", "MHC_PARITY_SUITE", "PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")


def source_copy(root: pathlib.Path, folder: pathlib.Path) -> pathlib.Path:
    """The files of checkout `root` in `folder`, without its build outputs and environments."""
    shutil.copytree(root, folder, ignore=shutil.ignore_patterns(*BUILD_OUTPUTS))
    return folder


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_entries(site_packages: pathlib.Path, distributions: tuple[str, ...]) -> set[str]:
    """The entries of `site_packages` that belong to the installed `distributions`: each one's
    metadata folder and the top-level names its files are under (not scripts, `../../bin/...`,
    nor the shared __pycache__). Read from the folder itself, never through sys.path, where a
    checkout's build metadata (`mhc_parity.egg-info` beside the tests) would answer instead:
    a link left to an installed distribution's metadata lets pip, replacing it in the scratch
    venv, write through the link into this venv."""
    wanted = {_normalized(name) for name in distributions}
    found = set()
    for metadata in sorted([*site_packages.glob("*.dist-info"), *site_packages.glob("*.egg-info")]):
        distribution = importlib.metadata.Distribution.at(metadata)
        if _normalized(distribution.metadata["Name"] or "") in wanted:
            found.add(metadata.name)
            found |= {f.parts[0] for f in distribution.files or () if f.parts[0] not in ("..", "__pycache__")}
    return found


@dataclasses.dataclass(frozen=True)
class ScratchVenv:
    """A venv in `folder` (`create`): `env` is the environment of a shell in it, `run` runs a
    command there."""

    folder: pathlib.Path

    @property
    def bin(self) -> pathlib.Path:
        return pathlib.Path(sysconfig.get_path("scripts", vars={"base": self.folder, "platbase": self.folder}))

    @property
    def python(self) -> pathlib.Path:
        return self.bin / "python"

    @property
    def site_packages(self) -> pathlib.Path:
        return pathlib.Path(sysconfig.get_path("purelib", vars={"base": self.folder, "platbase": self.folder}))

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment as an activated scratch venv has it, plus `extra`;
        installs skip dependencies (they are linked already)."""
        env = {k: v for k, v in os.environ.items() if k not in OUTER_VARIABLES}
        env.update(VIRTUAL_ENV=str(self.folder), PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}")
        env.update(PIP_NO_DEPS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        # The checkout's cache folder, as this venv's runs use it: an installed copy of the
        # same sources keys its fixtures, oracle answers and programs alike, and computes
        # only what is not there (a process running foreign code writes none of our stores).
        env["MHC_PARITY_CACHE"] = str(cache_root())
        return {**env, **extra}

    def run(self, command: str, cwd: pathlib.Path, timeout: float = 600, **extra: str) -> subprocess.CompletedProcess:
        """`command` in bash, in `cwd`, in this venv (`env(**extra)`)."""
        return subprocess.run(
            ["bash", "-c", command], cwd=cwd, env=self.env(**extra), capture_output=True, text=True, timeout=timeout
        )


def _console_script(scratch: ScratchVenv, distribution: str, name: str) -> None:
    """The console script `name` of an installed distribution, written into the scratch bin/
    as an installer writes it (run by the scratch interpreter)."""
    scripts = importlib.metadata.distribution(distribution).entry_points.select(group="console_scripts")
    (entry,) = [e for e in scripts if e.name == name]
    module, _, function = entry.value.partition(":")
    script = scratch.bin / name
    script.write_text(f"#!{scratch.python}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n")
    script.chmod(0o755)


def create(folder: pathlib.Path, *, replacing: tuple[str, ...]) -> ScratchVenv:
    """A venv in `folder` with this interpreter's packages but the distributions `replacing`
    (the test installs those), and the `pip` and `pytest` commands."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    scratch = ScratchVenv(folder)
    base = pathlib.Path(sysconfig.get_path("purelib"))
    assert base != scratch.site_packages and sys.prefix != sys.base_prefix, "run the tests in the project's venv"
    left_out = {"__pycache__"} | installed_entries(base, replacing)
    for entry in sorted(base.iterdir()):
        if entry.name not in left_out:
            (scratch.site_packages / entry.name).symlink_to(entry)
    assert not installed_entries(scratch.site_packages, replacing), f"{replacing} are still linked"
    for distribution, name in (("pip", "pip"), ("pytest", "pytest")):
        _console_script(scratch, distribution, name)
    return scratch
