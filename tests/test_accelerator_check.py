"""bench/accelerator_check.sh on this CPU machine: it says there is no accelerator and what it still checked."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import accelerator_report  # noqa: E402


@pytest.mark.slow
def test_the_check_reports_no_accelerator_and_what_it_still_checked(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), EXTRAS="")
    proc = subprocess.run(
        ["bash", "bench/accelerator_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "accelerator check: extra 'none'" in out
    assert re.search(r"^backend: cpu \(8 x cpu\);.*matmul precision: highest=float32$", out, re.M)
    assert "no accelerator: JAX's default backend is cpu" in out
    assert "still checked: explicit matmul precision" in out
    assert re.search(r"^tests: \d+ passed, 8 skipped in ", out, re.M), out
    skipped = [line for line in out.splitlines() if line.startswith("skipped: tests/test_hardware.py")]
    assert skipped and all("jax.default_backend() is 'cpu'" in line for line in skipped)
    assert {m for line in skipped for m in re.findall(r"needs a (\w+) backend", line)} == {"tpu", "gpu"}
    assert out.strip().splitlines()[-1].startswith("accelerator check: PASS on cpu in ")


@pytest.mark.parametrize(("driver_cuda", "extra"), [("13.0", "cuda13"), ("12.8", "cuda"), ("", "cuda")])
def test_an_nvidia_driver_picks_the_cuda_plugin_it_supports(tmp_path, driver_cuda, extra):
    fake = tmp_path / "nvidia-smi"
    header = f"| NVIDIA-SMI 580.159.03   Driver Version: 580.159.03   CUDA Version: {driver_cuda}     |"
    fake.write_text(f"#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\necho '{header if driver_cuda else ''}'\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("EXTRAS", "TPU_ACCELERATOR_TYPE")}
    env["PATH"] = f"{tmp_path}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        ["bash", "bench/accelerator_check.sh", "--print-extra"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == extra


def test_an_extra_the_backend_does_not_match_is_refused(capsys):
    """The script's `main` in this process (its `__main__` only exits with what main returns;
    the whole script runs as a process in the check above)."""
    assert accelerator_report.main(["probe", "tpu"]) == 3
    assert "the 'tpu' extra is installed but JAX's default backend is 'cpu', not 'tpu'" in capsys.readouterr().out


def test_one_summary_line_per_path():
    rows = [
        {"candidate": "interpret/unsharded", "verdict": "pass", "devices": "tpu:0", "matmul_precision": "highest"},
        {"candidate": "interpret/unsharded", "verdict": "fail", "devices": "tpu:0", "matmul_precision": "highest"},
        {"candidate": "mosaic/sharded(data=2,fsdp=4)", "verdict": "skip", "devices": "", "matmul_precision": "highest"},
    ]
    assert accelerator_report.path_lines(rows) == [
        "path interpret/unsharded: 1 pass, 1 fail [tpu:0 at highest]",
        "path mosaic/sharded(data=2,fsdp=4): 1 skip [did not run]",
    ]


def _make(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("EXTRAS", "SYSTEM_JAX")}
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_the_machines_own_jax_has_its_own_venv_and_no_extra():
    assert _make("print-venv").stdout.strip() == ".venv"
    assert _make("print-venv", "SYSTEM_JAX=1").stdout.strip() == ".venv-system"
    assert _make("print-venv", "SYSTEM_JAX=0").stdout.strip() == ".venv"
    refused = _make("print-venv", "SYSTEM_JAX=1", "EXTRAS=tpu")
    assert refused.returncode == 2 and "SYSTEM_JAX=1 uses the machine's own jax" in refused.stderr
    assert "SYSTEM_JAX must be empty, 0 or 1, got 'yes'" in _make("print-venv", "SYSTEM_JAX=yes").stderr
