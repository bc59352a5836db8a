"""Where things run: the oracle and fixtures on the host CPU, paths on placed devices."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine import devices
from mhc_parity.harness.engine.case_judging import last_readers
from mhc_parity.harness.engine.devices import PlacementError, choose_devices, device_label, needs_host, precision_label
from mhc_parity.harness.engine.implementations import INTERPRET, MOSAIC, REFERENCE
from mhc_parity.harness.engine.oracle_path import run_oracle_path
from mhc_parity.harness.engine.paths import Path
from mhc_parity.harness.engine.plan import PathPlan, comparisons_of
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.mhc import oracle

SMALL = Case(name="placement-small", batch=1, sequence=16, streams=2, embedding=128, branch="mlp")


def _another_default_device():
    """A device that is not the oracle's: a non-CPU one if this machine has one, else the last CPU."""
    accelerators = [d for d in jax.devices() if d.platform != "cpu"]
    return accelerators[0] if accelerators else jax.devices("cpu")[-1]


@pytest.fixture
def oracle_outputs(monkeypatch):
    """Every output array of the oracle's jitted programs, collected while a test runs."""
    seen = []
    original = oracle._oracle_program

    def spying(*key):
        program = original(*key)

        def run(*args):
            outputs = program(*args)
            seen.append(outputs)
            return outputs

        return run

    monkeypatch.setattr(oracle, "_oracle_program", spying)
    return seen


def _devices_of(outputs) -> set:
    return {device for leaf in jax.tree.leaves(outputs) for device in leaf.devices()}


@pytest.mark.slow
def test_the_oracle_runs_on_the_host_cpu_under_another_default_device(oracle_outputs):
    other = _another_default_device()
    assert other != oracle.oracle_device()
    fixture = make_fixture(SMALL)
    with jax.default_device(other):
        run_oracle_path(SMALL, fixture)  # the exact oracle and its noisy draws: one batched program
    assert oracle_outputs
    placed = _devices_of(oracle_outputs)
    assert placed == {oracle.oracle_device()}, placed
    assert oracle.oracle_device().platform == "cpu"


def test_the_oracle_placement_is_observed_by_the_spy(oracle_outputs):
    """Control: the spy sees where a program ran (it is not blind to the default device)."""
    program = jax.jit(lambda x: x + 1)
    other = _another_default_device()
    with jax.default_device(other):
        assert _devices_of(program(jnp.ones(3))) == {other}


def test_fixtures_never_touch_a_device():
    fresh = dataclasses.replace(SMALL, name="placement-fresh", seed=12345)
    with jax.transfer_guard("disallow"):
        with pytest.raises(Exception, match="Disallowed host-to-device transfer"):
            jnp.sin(np.ones(3))  # control: the guard bites on an implicit transfer
        fixture = make_fixture(fresh, use_cache=False)
    arrays = fixture.arrays()
    assert arrays and all(type(a) is np.ndarray for a in arrays.values())


# --------------------------------------------------------------------------- placement


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    platform: str
    id: int


TPU1 = [FakeDevice("tpu", 0)]
TPU8 = [FakeDevice("tpu", i) for i in range(8)]
CPU8 = [FakeDevice("cpu", i) for i in range(8)]


def test_device_labels_name_the_platform_and_compress_ids():
    assert device_label(CPU8) == "cpu:0-7"
    assert device_label(TPU1) == "tpu:0"
    assert device_label([FakeDevice("cpu", i) for i in (0, 1, 2, 5, 7, 8)]) == "cpu:0-2,5,7-8"


def test_sharded_paths_use_the_default_backend_when_it_has_enough_devices():
    assert not needs_host(8, TPU8)
    placement = choose_devices(8, host=False, default_devices=TPU8, host_devices=CPU8)
    assert placement.label == "tpu:0-7" and placement.platform == "tpu"


def test_a_single_chip_accelerator_sends_sharded_paths_to_the_host_cpu_and_says_so():
    assert needs_host(8, TPU1)
    placement = choose_devices(8, host=True, default_devices=TPU1, host_devices=CPU8)
    assert placement.label == "cpu:0-7 (host: tpu has 1 device)"


def test_a_cpu_backend_never_falls_back_and_too_few_devices_is_a_skip_reason():
    assert not needs_host(16, CPU8)
    with pytest.raises(PlacementError, match="mesh needs 16 devices, the default backend \\(cpu\\) has 8"):
        choose_devices(16, host=False, default_devices=CPU8, host_devices=CPU8)
    with pytest.raises(PlacementError, match="the host cpu has 8"):
        choose_devices(16, host=True, default_devices=TPU1, host_devices=CPU8)


def test_the_plan_moves_sharded_paths_to_the_host_with_their_unsharded_twins(monkeypatch):
    case = Case(name="placement-sharded", batch=2, sequence=64, streams=4, embedding=128, mesh=(2, 4))
    plan = PathPlan((REFERENCE, INTERPRET, MOSAIC))
    monkeypatch.setattr("mhc_parity.harness.engine.plan.host_fallback", lambda needed: False)
    assert "@cpu" not in " ".join(p.name for p in plan.paths_for(case))
    monkeypatch.setattr("mhc_parity.harness.engine.plan.host_fallback", lambda needed: True)
    paths = plan.paths_for(case)
    names = [p.name for p in paths]
    assert names == [
        "reference/unsharded",
        "interpret/unsharded",
        "mosaic/unsharded",
        "reference/unsharded@cpu",
        "interpret/unsharded@cpu",
        "reference/sharded(data=2,fsdp=4)@cpu",
        "interpret/sharded(data=2,fsdp=4)@cpu",
        "mosaic/sharded(data=2,fsdp=4)",
    ]
    by_name = {p.name: p for p in paths}
    assert comparisons_of(by_name["interpret/sharded(data=2,fsdp=4)@cpu"], paths) == [
        ("vs_oracle", "oracle"),
        ("vs_reference", "reference/sharded(data=2,fsdp=4)@cpu"),
        ("vs_unsharded", "interpret/unsharded@cpu"),
    ]

    # The comparisons read each path's leaves last at: its float64 copies are dropped after that path.
    assert last_readers(paths) == {
        "reference/unsharded": 2,  # mosaic/unsharded's vs_reference
        "interpret/unsharded": 1,
        "mosaic/unsharded": 7,  # mosaic on the mesh, vs_unsharded
        "reference/unsharded@cpu": 5,
        "interpret/unsharded@cpu": 6,
        "reference/sharded(data=2,fsdp=4)@cpu": 6,
        "interpret/sharded(data=2,fsdp=4)@cpu": 6,
        "mosaic/sharded(data=2,fsdp=4)": 7,
    }


def test_a_host_path_runs_on_the_host_cpu(monkeypatch):
    path = Path(REFERENCE, None, host=True)
    assert path.name == "reference/unsharded@cpu"
    placement = devices.path_placement(path)
    assert placement.platform == "cpu" and placement.devices[0] == jax.devices("cpu")[0]
    outputs = ProgramCache().run(path, SMALL, make_fixture(SMALL))
    assert set(outputs.leaves) >= {"out", "d_x", "d_branch.w_in"}


def test_precision_labels_say_when_default_runs_as_highest():
    assert precision_label("highest", "cpu") == "highest"
    assert precision_label("default", "cpu") == "highest (default requested; cpu default is full float32)"
    assert precision_label("default", "tpu") == "default"
    assert precision_label("default", "gpu", "7.0") == "highest (default requested; gpu default is full float32)"
    assert precision_label("default", "gpu", "9.0") == "default"


def test_branch_apply_defaults_to_the_highest_precision():
    spec = get_branch("mlp")
    params = {k: jnp.asarray(v, jnp.float32) for k, v in spec.init(np.random.default_rng(0), 128).items()}
    h = jnp.ones((1, 4, 128), jnp.float32)
    np.testing.assert_array_equal(spec.apply(params, h), spec.apply(params, h, "highest"))


def test_a_process_short_of_cpu_devices_for_a_sharded_path_lacks_them_where_the_path_runs_on_the_cpu():
    """`cpu_devices_lacking`: a sharded path placed on the CPU (a CPU backend, or the host
    fallback of a single-chip accelerator) lacks what XLA_FLAGS' device count leaves short,
    which `configure` makes a usage error instead of a skipped path; Mosaic (no CPU) and an
    accelerator's own chip count lack nothing there: those stay skips with their reasons."""
    cpu4 = CPU8[:4]
    mesh = (2, 4)
    for default, host in ((CPU8, False), (TPU1, True)):
        for impl in (REFERENCE, INTERPRET):
            path = Path(impl, mesh, host=host)
            assert devices.cpu_devices_lacking(path, default_devices=default, host_devices=cpu4) == 4
            assert devices.cpu_devices_lacking(path, default_devices=default, host_devices=CPU8) == 0
    assert devices.cpu_devices_lacking(Path(MOSAIC, mesh), default_devices=CPU8, host_devices=cpu4) == 0
    assert devices.cpu_devices_lacking(Path(MOSAIC, mesh), default_devices=TPU1, host_devices=cpu4) == 0
    assert devices.cpu_devices_lacking(Path(INTERPRET, mesh), default_devices=TPU8, host_devices=cpu4) == 0
    assert devices.cpu_devices_lacking(Path(INTERPRET, None), default_devices=CPU8, host_devices=cpu4[:1]) == 0
