"""harness.env: the XLA flags take effect until the JAX backend starts, and never silently after."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_python(code: str, xla_flags: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_flags_set_after_importing_jax_take_effect_before_the_backend_starts():
    proc = run_python(
        "import jax, harness.paths\n"
        "from harness.env import backend_started, ensure_host_devices\n"
        "assert not backend_started()\n"
        "ensure_host_devices()\n"
        "print(len(jax.devices('cpu')), backend_started())\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["8", "True"]


def test_a_backend_started_without_the_flags_is_an_error_not_other_numbers():
    proc = run_python(
        "import jax\n"
        "jax.devices()\n"
        "from harness.env import ensure_host_devices\n"
        "ensure_host_devices()\n"
    )
    assert proc.returncode != 0
    assert "RuntimeError: the JAX backend started before XLA_FLAGS had" in proc.stderr


def test_flags_the_user_set_are_kept():
    flags = "--xla_force_host_platform_device_count=4 --xla_allow_excess_precision=false"
    proc = run_python(
        "import os, jax\n"
        "from harness.env import ensure_host_devices\n"
        "ensure_host_devices()\n"
        "print(len(jax.devices('cpu')), os.environ['XLA_FLAGS'])\n",
        xla_flags=flags,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"4 {flags}"


def test_the_command_line_and_its_workers_pace_the_garbage_collector():
    """Tracing allocates millions of short-lived objects: at Python's default thresholds the
    cycle collector held the GIL for seconds of a run (harness.env.GC_THRESHOLDS)."""
    proc = run_python(
        "import concurrent.futures, contextlib, gc, io, multiprocessing\n"
        "from harness import cli, parallel\n"
        "from harness.env import GC_THRESHOLDS\n"
        "from harness.implementations import BUILTIN\n"
        "from harness.plan import PathPlan\n"
        "from harness.policy import load_policy\n"
        "assert gc.get_threshold() != GC_THRESHOLDS\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert cli.main(['policy']) == 0\n"
        "assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold()\n"
        "gc.set_threshold(700, 10, 10)\n"
        "spec = parallel._spec(load_policy(), PathPlan(implementations=tuple(BUILTIN.values())))\n"
        "with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'),\n"
        "        initializer=parallel._start_worker, initargs=(spec,)) as pool:\n"
        "    assert pool.submit(gc.get_threshold).result() == GC_THRESHOLDS\n"
        "print('ok')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
