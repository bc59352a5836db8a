"""mhc_parity.harness.env: the XLA flags take effect until the JAX backend starts, and never silently after."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from mhc_parity.harness.env import COMPILE_ONLY_LIBTPU_ENV, quiet_compile_only_libtpu, required_xla_flags, tpu_host
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
        "    import mhc_parity.reports.html.page\n"
        "seen['stays_off'] = not gc.isenabled()\n"
        "seen['frozen'] = gc.get_freeze_count() > permanent\n"
        "print(json.dumps(seen))\n"
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert all(seen.values()), seen


def _without_libtpu_settings() -> dict:
    drop = set(COMPILE_ONLY_LIBTPU_ENV) | {"XLA_FLAGS", "JAX_PLATFORMS"}
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed here")
@pytest.mark.skipif(tpu_host(), reason="a TPU host: libtpu finds its chips, and its settings are left alone")
def test_libtpu_is_quiet_and_jax_stays_on_the_cpu_of_a_host_without_tpus():
    # Without the entry point's set-up, libtpu prints warnings as soon as JAX tries its
    # plugin; with it, nothing, the default backend is the CPU, and two processes can both
    # make compile-only TPU devices (libtpu's lockfile lets one only, unless told otherwise).
    code = (
        "import jax\n"
        "from mhc_parity.harness.env import ensure_host_devices\n"
        "ensure_host_devices()\n"
        "from jax.experimental import topologies\n"
        "print(jax.default_backend(), len(topologies.get_topology_desc('v5e=2x4', platform='tpu').devices))\n"
    )
    bare = subprocess.run(  # past the lockfile (another process may hold it), with no other setting
        [sys.executable, "-c", "import jax; jax.devices()"],
        env={**_without_libtpu_settings(), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "TPU_ACCELERATOR_TYPE" in bare.stderr  # the noise the set-up exists to silence
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=_without_libtpu_settings(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert out.split() == ["cpu", "8"]
        assert err == ""


def test_a_tpu_host_is_told_by_its_devices_or_by_jax_platforms(tmp_path):
    assert not tpu_host(tmp_path, {})
    assert tpu_host(tmp_path, {"JAX_PLATFORMS": "tpu,cpu"})
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "vfio").touch()  # the VFIO control node alone is no TPU
    assert not tpu_host(tmp_path, {})
    (tmp_path / "vfio" / "0").touch()
    assert tpu_host(tmp_path, {})
    (tmp_path / "vfio" / "0").unlink()
    (tmp_path / "accel0").touch()
    assert tpu_host(tmp_path, {})


def test_libtpu_settings_are_set_only_off_a_tpu_host_and_never_override_the_user(tmp_path):
    environ = {"TPU_WORKER_HOSTNAMES": "mine"}
    quiet_compile_only_libtpu(tmp_path, environ)
    assert environ == {**COMPILE_ONLY_LIBTPU_ENV, "TPU_WORKER_HOSTNAMES": "mine"}
    (tmp_path / "accel0").touch()
    on_a_tpu = {}
    quiet_compile_only_libtpu(tmp_path, on_a_tpu)
    assert on_a_tpu == {}
