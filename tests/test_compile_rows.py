"""Compile rows: the real TPU compiler (libtpu) on this host, its causes, its store, its faults."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.catalogue import COMPILED_DEFAULT_CASES
from mhc_parity.harness.engine import compile_rows as compile_rows_module
from mhc_parity.harness.engine.compile_rows import (
    CompileResult,
    case_compile_rows,
    compile_rows,
    failure_cause,
    vmem_bytes,
)
from mhc_parity.harness.engine.compile_store import CompileStore
from mhc_parity.harness.engine.tpu_targets import TARGETS, compiler_missing, compiles_case, target_mesh
from mhc_parity.harness.faults.compile_faults import COMPILE_FAULTS, caught, compile_fault_rows
from mhc_parity.records.schema import ROW_COLUMNS

needs_compiler = pytest.mark.skipif(bool(compiler_missing()), reason=compiler_missing() or "libtpu is installed")

# The compiler's messages as measured on libtpu 0.0.50.1 (first lines and the VMEM line).
PRECISION = (
    "JaxRuntimeError: INTERNAL: Mosaic failed to compile TPU kernel with MLIR module name "
    "`mhc_pre_forward` HLO name `mhc_pre_forward.1`: Bad lhs type"
)
VMEM = (
    "JaxRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory in memory space "
    "vmem while allocating on stack for %mhc_post_forward.1 = ... Scoped allocation with size 33.51M and "
    "limit 32.00M exceeded scoped vmem limit by 1.51M."
)
PARTITIONING = (
    "NotImplementedError: Mosaic kernels cannot be automatically partitioned. Please wrap the call in a shard_map."
)


def test_each_measured_failure_gets_its_cause_and_a_vmem_overflow_its_bytes():
    assert failure_cause(PRECISION) == "precision"
    assert failure_cause(VMEM) == "vmem"
    assert failure_cause(PARTITIONING) == "partitioning"
    assert failure_cause("NotImplementedError: Unimplemented primitive in Pallas TPU lowering: erf_inv") == (
        "unsupported op"
    )
    assert failure_cause("ValueError: something else") == "other"
    assert vmem_bytes(VMEM) == (33.51 * 2**20, 32 * 2**20)
    result = CompileResult.failed("post_forward", VMEM)
    assert (result.cause, result.vmem_allowed_bytes) == ("vmem", 32 * 2**20)
    assert result.first_line.endswith("(asked 33.51 MiB, allowed 32.00 MiB)")
    assert math.isnan(CompileResult.failed("pre_forward", PRECISION).vmem_asked_bytes)


def test_the_stated_cases_get_compile_rows_and_cover_each_dtype_on_a_token_mesh():
    default = registry.select(suite="default")
    compiled = [case for case in default if compiles_case(case)]
    assert {case.name for case in compiled} == set(COMPILED_DEFAULT_CASES)
    assert {case.dtype for case in compiled} == {"float32", "bfloat16"}
    assert all(case.mesh is not None for case in compiled)
    assert all(compiles_case(case) for case in registry.select(suite="tpu"))


@needs_compiler
def test_every_target_has_one_chip_and_an_eight_chip_slice_of_its_kind():
    for target in TARGETS:
        chip, whole = target_mesh(target, None), target_mesh(target, (2, 4))
        assert chip.devices.shape == (1, 1) and whole.devices.shape == (2, 4)
        kinds = {d.device_kind for d in [*chip.devices.flat, *whole.devices.flat]}
        assert kinds == {target.device_kind}
    with pytest.raises(ValueError, match="needs 16 chips"):
        target_mesh(TARGETS[0], (4, 4))


@needs_compiler
def test_a_compile_row_names_target_program_cause_and_memory_and_a_warm_store_compiles_nothing(tmp_path, monkeypatch):
    case = registry.get(next(name for name in COMPILED_DEFAULT_CASES if "-f32-" in name))
    store = CompileStore(tmp_path)

    def v5e(name):
        return name == "compile/v5e/unsharded"

    rows = list(compile_rows(case, store, v5e))
    assert [r["leaf"] for r in rows] == ["pre_forward", "post_forward", "pre_backward", "post_backward"]
    assert all(set(r) == set(ROW_COLUMNS) for r in rows)
    assert {r["target"] for r in rows} == {"v5e (v5e=1x1)"} and {r["comparison"] for r in rows} == {"compile"}
    for row in rows:
        assert row["verdict"] == "pass", row["reason"]
        assert row["code_bytes"] > 0 and row["argument_bytes"] > 0
    compiled = store.programs.misses

    def no_compile(*args, **kwargs):
        raise AssertionError("a warm store compiled or lowered a program")

    monkeypatch.setattr(compile_rows_module, "compile_program", no_compile)
    again = list(compile_rows(case, store, v5e))
    assert [r["verdict"] for r in again] == ["pass"] * 4 and store.programs.misses == compiled
    assert [r["code_bytes"] for r in again] == [r["code_bytes"] for r in rows]


def test_without_libtpu_each_target_and_mesh_is_one_skip_row_saying_the_kernels_were_only_lowered(monkeypatch):
    monkeypatch.setattr(compile_rows_module, "compiler_missing", lambda: "no TPU compiler on this host")
    case = registry.get(next(iter(COMPILED_DEFAULT_CASES)))
    rows = list(compile_rows(case))
    assert len(rows) == 2 * len(TARGETS)
    assert {r["verdict"] for r in rows} == {"skip"}
    assert all("only lowered" in r["reason"] for r in rows)


# The programs a compile fault's rows are compiled for where not all four: the VMEM fault fails
# post_forward alone (its post-apply step asks 33.51 MiB of 32, compile_faults.py) and the other
# three compile and pass under it, at 512-token blocks the costliest compiles of this file (about
# 35 of its 38 s); the fitted blocks' four programs are compiled by the test after this one.
FAULT_PROGRAMS = {"kernel.blocks_overflow_vmem": ("post_forward",)}


def only_programs(monkeypatch, names) -> None:
    """Compile rows of this project's kernels for the programs `names` only (in that order)."""
    every = compile_rows_module.kernel_programs

    def named(*args, **kwargs):
        programs = every(*args, **kwargs)
        return {name: programs[name] for name in names}

    monkeypatch.setattr(compile_rows_module, "kernel_programs", named)


@needs_compiler
@pytest.mark.parametrize("fault", COMPILE_FAULTS, ids=lambda fault: fault.name)
def test_each_compile_fault_fails_its_compile_rows_naming_its_cause(fault, tmp_path, monkeypatch):
    if fault.name in FAULT_PROGRAMS:
        only_programs(monkeypatch, FAULT_PROGRAMS[fault.name])
    rows = compile_fault_rows(fault, CompileStore(tmp_path))
    assert rows, fault.paths
    if fault.name in FAULT_PROGRAMS:
        assert [r["leaf"] for r in rows] == list(FAULT_PROGRAMS[fault.name])
    assert caught(fault, rows), [(r["leaf"], r["verdict"], r["compile_cause"], r["reason"]) for r in rows]


@needs_compiler
def test_the_vmem_fault_s_case_compiles_with_the_fitted_blocks(tmp_path):
    (fault,) = [f for f in COMPILE_FAULTS if f.cause == "vmem"]
    clean = list(case_compile_rows(fault.case, CompileStore(tmp_path), lambda n: n == "compile/v5e/unsharded"))
    assert [r["verdict"] for r in clean] == ["pass"] * 4, [r["reason"] for r in clean]


@needs_compiler
def test_the_bare_kernel_fault_is_the_partitioner_s_refusal_and_the_shard_mapped_kernels_pass(tmp_path):
    (fault,) = [f for f in COMPILE_FAULTS if f.cause == "partitioning"]
    clean = list(case_compile_rows(fault.case, CompileStore(tmp_path), lambda n: n.startswith("compile/v5e/sharded")))
    assert [r["verdict"] for r in clean] == ["pass"] * 4, [r["reason"] for r in clean]
    faulty = compile_fault_rows(fault, CompileStore(tmp_path))
    assert all(r["verdict"] == "fail" and "shard_map" in r["reason"] for r in faulty)


@needs_compiler
def test_one_chip_targets_are_laid_out_whatever_the_tpu_host_s_own_host_bounds():
    """On the lent TPU v5e (libtpu 0.0.42.1) the machine's TPU_CHIPS_PER_HOST_BOUNDS=2,2,1 made
    every one-chip topology fail ('not divisible by ... chips_per_host_bounds "2x2x1"'): the
    one-chip targets say their own host bounds."""
    probe = (
        "from mhc_parity.harness.engine.tpu_targets import TARGETS, topology_devices\n"
        "print([len(topology_devices(t.chip)) for t in TARGETS])"
    )
    env = {**os.environ, "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_HOST_BOUNDS": "1,1,1", "JAX_PLATFORMS": "cpu"}
    env.update(
        {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_WORKER_HOSTNAMES": "localhost"}
    )
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == str([1] * len(TARGETS)), proc.stderr[-2000:]
