"""mhc_parity.harness.processes.worker_processes: workers forked from a server started early still
see their parent as it is."""

from __future__ import annotations

import sys

import pytest

from mhc_parity.harness.cli import impl_modules, requests_workers
from mhc_parity.harness.processes.worker_processes import project_modules
from tests.cli_support import run_python

# A worker's start-up spec for the built-in implementations, as `ParallelRunner` makes it.
WORKER_SPEC = (
    "from mhc_parity.harness.processes import parallel\n"
    "from mhc_parity.harness.engine.implementations import BUILTIN\n"
    "from mhc_parity.harness.engine.plan import PathPlan\n"
    "from mhc_parity.harness.judging.policy_file import load_policy\n"
    "spec = parallel._spec(load_policy(), PathPlan(implementations=tuple(BUILTIN.values())))\n"
)


def test_a_worker_sees_the_parent_as_it_is_when_the_pool_is_made_not_at_the_servers_start(tmp_path):
    probe = tmp_path / "worker_probe_module.py"  # found only through the sys.path entry added later
    probe.write_text("")
    proc = run_python(
        "import concurrent.futures, importlib.util, os, sys\n"
        "from mhc_parity.harness.processes import worker_processes\n"
        "worker_processes.start_worker_server()  # the server starts with this process as it is now\n"
        "os.environ['MHC_PARITY_PROBE'] = 'set later'\n"
        "os.chdir(sys.argv[1])\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "with concurrent.futures.ProcessPoolExecutor(\n"
        "        1, mp_context=worker_processes.worker_context(), initializer=worker_processes.adopt_environment,\n"
        "        initargs=(worker_processes.environment_of_this_process(),)) as pool:\n"
        "    print(pool.submit(os.getenv, 'MHC_PARITY_PROBE').result())\n"
        "    print(pool.submit(os.getcwd).result())\n"
        "    print(pool.submit(importlib.util.find_spec, 'worker_probe_module').result().origin)\n"
        "    print(worker_processes.worker_context().get_start_method())\n",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    expected_method = "forkserver" if sys.platform != "win32" else "spawn"
    assert proc.stdout.split("\n")[:4] == ["set later", str(tmp_path), str(probe), expected_method]


def test_adopting_an_environment_replaces_it_whole():
    proc = run_python(
        "import os\n"
        "from mhc_parity.harness.processes.worker_processes import adopt_environment, environment_of_this_process\n"
        "parent = environment_of_this_process()\n"
        "os.environ['MHC_PARITY_PROBE'] = 'worker only'\n"
        "adopt_environment(parent)\n"
        "print(os.getenv('MHC_PARITY_PROBE'), dict(os.environ) == dict(parent))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "True"]


def test_a_worker_refuses_to_begin_with_a_started_jax_backend():
    """What forking after the backend started would give (a forked XLA runtime is unsafe)."""
    proc = run_python(
        "import jax\n"
        "from mhc_parity.harness.env import ensure_host_devices\n"
        "ensure_host_devices()\n"
        "jax.devices()\n" + WORKER_SPEC + "parallel._start_worker(spec)\n"
    )
    assert proc.returncode != 0
    assert "RuntimeError: a worker process began with a JAX backend already started" in proc.stderr


def test_a_worker_paces_the_garbage_collector():
    """As the command line does (tests/test_env.py): a worker traces and compiles its cases."""
    proc = run_python(
        "import concurrent.futures, gc\n"
        "from mhc_parity.harness.env import GC_THRESHOLDS\n"
        "from mhc_parity.harness.processes.worker_processes import worker_context\n"
        + WORKER_SPEC
        + "with concurrent.futures.ProcessPoolExecutor(1, mp_context=worker_context(),\n"
        "                                            initializer=parallel._start_worker,\n"
        "                                            initargs=(spec,)) as pool:\n"
        "    print(pool.submit(gc.get_threshold).result() == GC_THRESHOLDS)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


@pytest.mark.parametrize(
    ("command", "arguments", "expected"),
    [
        ("run", ["--suite", "smoke", "--jobs", "2"], True),
        ("run", ["--jobs=auto"], True),
        ("run", ["--jobs", "1"], False),
        ("run", ["--jobs=1"], False),
        ("run", ["--suite", "smoke"], False),  # --jobs defaults to 1
        ("faults", ["--jobs", "2"], False),  # its workers spawn when its groups start
    ],
)
def test_the_command_line_starts_the_worker_server_only_for_a_run_with_workers(command, arguments, expected):
    assert requests_workers(command, arguments) is expected


def test_the_worker_server_imports_only_the_project_s_own_impl_modules():
    """`make parity-maxtext`'s workers start with MaxText imported by their server; a user's
    module (which might start a JAX backend on import) is imported by each worker itself."""
    arguments = ["--impl", "mhc_parity.maxtext_parity:implementations", "--impl=my.kernel:factory", "--jobs", "2"]
    modules = impl_modules(arguments)
    assert modules == ("mhc_parity.maxtext_parity", "my.kernel")
    assert project_modules((*modules, "mhc_parity_extra.kernel", "mhc_parity")) == [
        "mhc_parity.maxtext_parity",
        "mhc_parity",
    ]
