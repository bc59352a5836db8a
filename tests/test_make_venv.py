"""tools/make-venv: a Python older than requires-python is never used, and the error says what to install."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _make_venv(tmp_path, **env):
    return subprocess.run(
        ["sh", str(ROOT / "tools" / "make-venv"), str(tmp_path / "venv")],
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
    venv_python.symlink_to(sys.executable)  # this test's own Python meets requires-python
    proc = _make_venv(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert venv_python.is_symlink() and proc.stderr == ""
