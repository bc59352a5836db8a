"""tools/make-venv: a Python older than the install needs is never used, and the error says what to install."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PINNED_PYTHON = tuple(
    int(p)
    for p in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mhc-parity"]["pinned-python"].split(".")
)


def _make_venv(tmp_path, **env):
    return _make_venv_with(tmp_path, **env)


def _make_venv_with(tmp_path, *options, **env):
    return subprocess.run(
        ["sh", str(ROOT / "tools" / "make-venv"), *options, str(tmp_path / "venv")],
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_qualifying_python_is_one_line_naming_what_to_install(tmp_path):
    fakes = tmp_path / "bin"
    fakes.mkdir()
    for name in ["python3"] + [f"python3.{n}" for n in range(12, 17)]:
        (fakes / name).write_text("#!/bin/sh\nexit 1\n")  # what a pyenv shim with no version does
        (fakes / name).chmod(0o755)
    proc = _make_venv(
        tmp_path, PATH=f"{fakes}{os.pathsep}/usr/bin{os.pathsep}/bin", PYENV_ROOT=str(tmp_path / "no-pyenv")
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "needs Python >= 3.12 and found none" in proc.stderr
    assert "pyenv install 3.12" in proc.stderr and "PYTHON=" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_a_named_python_that_is_too_old_is_refused(tmp_path):
    old = tmp_path / "python-old"
    old.write_text("#!/bin/sh\nexec python3 -c 'import sys; sys.exit(1)'\n")
    old.chmod(0o755)
    proc = _make_venv(tmp_path, PYTHON=str(old))
    assert proc.returncode == 2
    assert f"PYTHON={old} is not a Python >= 3.12 that runs" in proc.stderr


def test_a_venv_that_qualifies_is_kept(tmp_path):
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)  # this test's own Python: the pinned set's, or the oldest (test-compat)
    proc = _make_venv_with(tmp_path, *(() if sys.version_info >= PINNED_PYTHON else ("--oldest",)))
    assert proc.returncode == 0, proc.stderr
    assert venv_python.is_symlink() and proc.stderr == ""


def test_the_compat_venv_takes_exactly_the_oldest_python_requires_python_allows(tmp_path):
    newer = tmp_path / "python-3.12"  # this test's Python, saying it is 3.12 to make-venv's check (`-c CODE`)
    newer.write_text(
        f'#!/bin/sh\nexec {sys.executable} -c "import sys; sys.version_info = (3, 12, 1); exec(sys.argv[1])" "$2"\n'
    )
    newer.chmod(0o755)
    proc = _make_venv_with(tmp_path, "--oldest", PYTHON=str(newer))
    assert proc.returncode == 2
    assert f"PYTHON={newer} is not a Python == 3.11 that runs" in proc.stderr


def test_a_system_site_venv_replaces_one_that_does_not_see_the_system_packages(tmp_path):
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)  # a venv without the system's packages (no pyvenv.cfg says so)
    proc = _make_venv_with(tmp_path, "--system-site-packages", PYTHON=sys.executable)
    assert proc.returncode == 0, proc.stderr
    assert "system site packages: false); this install needs >= 3.11 (system site packages: true)" in proc.stderr
    config = (tmp_path / "venv" / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = true" in config


@pytest.mark.parametrize("system_jax", ["", "1"])
def test_setup_says_what_it_installs_before_each_pip_step(system_jax):
    """pip runs --quiet for minutes on a first set-up: a line before each step says what it installs
    (`make -n`: the recipe, nothing run; -W: as if pyproject.toml had changed)."""
    proc = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", "setup", f"SYSTEM_JAX={system_jax}"],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "EXTRAS", "PYTHON")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    steps = [i for i, line in enumerate(lines) if "pip install" in line or "install_on_own_jax.py" in line]
    assert steps, lines
    assert all(lines[i - 1].startswith('echo "setup: ') for i in steps), lines
