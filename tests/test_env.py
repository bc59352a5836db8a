"""mhc_parity.harness.env: the XLA flags take effect until the JAX backend starts, and never silently after."""

from __future__ import annotations

import json

from mhc_parity.harness.env import required_xla_flags
from tests.cli_support import run_python


def test_flags_set_after_importing_jax_take_effect_before_the_backend_starts():
    proc = run_python(
        "import jax, mhc_parity.harness.engine.paths\n"
        "from mhc_parity.harness.env import backend_started, ensure_host_devices\n"
        "assert not backend_started()\n"
        "ensure_host_devices()\n"
        "print(len(jax.devices('cpu')), backend_started())\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["8", "True"]


def test_a_backend_started_without_the_flags_is_an_error_not_other_numbers():
    proc = run_python(
        "import jax\njax.devices()\nfrom mhc_parity.harness.env import ensure_host_devices\nensure_host_devices()\n"
    )
    assert proc.returncode != 0
    assert "RuntimeError: the JAX backend started before XLA_FLAGS had" in proc.stderr


def test_flags_the_user_set_are_kept():
    flags = "--xla_force_host_platform_device_count=4 --xla_allow_excess_precision=false"
    if "--xla_cpu_max_isa" in required_xla_flags():
        flags += " --xla_cpu_max_isa=AVX2"
    proc = run_python(
        "import os, jax\n"
        "from mhc_parity.harness.env import ensure_host_devices\n"
        "ensure_host_devices()\n"
        "print(len(jax.devices('cpu')), os.environ['XLA_FLAGS'])\n",
        xla_flags=flags,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"4 {flags}"


def test_the_command_line_paces_the_garbage_collector():
    """Tracing allocates millions of short-lived objects: at Python's default thresholds the
    cycle collector held the GIL for seconds of a run (mhc_parity.harness.env.GC_THRESHOLDS). The
    workers: tests/test_worker_processes.py."""
    proc = run_python(
        "import contextlib, gc, io\n"
        "from mhc_parity.harness import cli\n"
        "from mhc_parity.harness.env import GC_THRESHOLDS\n"
        "assert gc.get_threshold() != GC_THRESHOLDS\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert cli.main(['policy']) == 0\n"
        "print(gc.get_threshold() == GC_THRESHOLDS)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def test_imports_run_with_the_collector_off_and_only_the_command_process_freezes_them():
    """`collector_paused_for_imports`: the collector is off inside and as it was after; with
    freeze, what exists then is in the permanent generation; without, nothing is frozen. The
    command line in a process of its own freezes (`entry`); `cli.main` called in a process that
    goes on (a test, a notebook) does not."""
    proc = run_python(
        "import contextlib, gc, io, json\n"
        "from mhc_parity.harness import cli\n"
        "from mhc_parity.harness.env import collector_paused_for_imports\n"
        "seen, permanent = {}, gc.get_freeze_count()\n"
        "with collector_paused_for_imports(freeze=False):\n"
        "    seen['off_inside'] = not gc.isenabled()\n"
        "seen['on_after'] = gc.isenabled()\n"
        "seen['unfrozen'] = gc.get_freeze_count() == permanent\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert cli.main(['policy']) == 0\n"
        "seen['main_unfrozen'] = gc.get_freeze_count() == permanent\n"
        "gc.disable()\n"
        "with collector_paused_for_imports(freeze=True):\n"
        "    import mhc_parity.reports.html\n"
        "seen['stays_off'] = not gc.isenabled()\n"
        "seen['frozen'] = gc.get_freeze_count() > permanent\n"
        "print(json.dumps(seen))\n"
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert all(seen.values()), seen
