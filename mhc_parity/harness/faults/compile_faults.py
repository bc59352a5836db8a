"""Faults only the TPU compiler catches: each must fail its compile rows, with its own cause.

Outside the kill matrix (which never meets Mosaic on a CPU and leaves compile rows out): each `CompileFault`
is a kernel-seam perturbation, a case and the compile cause its rows must name; tests/test_compile_rows.py
runs them on any host with libtpu. HIGHEST on bfloat16 operands, token blocks past VMEM, and kernels called
bare on a token-sharded mesh.
"""

from __future__ import annotations

import dataclasses
import fnmatch

import jax
import numpy as np

from mhc_parity.cases.catalogue import make_case
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine.compile_rows import case_compile_rows
from mhc_parity.harness.faults.fault_catalogue import KERNEL_IMPLEMENTATIONS
from mhc_parity.harness.faults.model import Patch, Perturbation, Seam

# One target shows the compiler catches it (each target's rows are the same program's).
FAULT_TARGET_GLOB = "compile/v5e/*"


def _highest_on_bfloat16(original_dot_precision):
    def dot_precision_highest_on_bfloat16(dtype, *args, **kwargs):
        if np.dtype(dtype) == np.dtype(jax.numpy.bfloat16):
            return jax.lax.Precision.HIGHEST
        return original_dot_precision(dtype, *args, **kwargs)

    return dot_precision_highest_on_bfloat16


def _requested_blocks_unchecked(original_fit_blocks):
    del original_fit_blocks

    def fit_blocks_unchecked(kernel, config, dtype, local_tokens):
        return kernel

    return fit_blocks_unchecked


def _bare_kernel_calls(original_run_token_sharded):
    del original_run_token_sharded

    def run_bare(fn, plan, activations, replicated, out_specs, *, check_vma=True):
        return fn(*activations, *replicated)

    return run_bare


@dataclasses.dataclass(frozen=True)
class CompileFault:
    """A fault, the case whose compile rows must fail under it, and the cause they must name; paths: the
    glob of the compile paths that must fail."""

    perturbation: Perturbation
    case: Case
    cause: str
    paths: str = FAULT_TARGET_GLOB

    @property
    def name(self) -> str:
        return self.perturbation.name


def _fault(name: str, description: str, module: str, attribute: str, replacement, cause: str) -> Perturbation:
    return Perturbation(
        name=name,
        description=description,
        patches=(Patch(Seam(module, attribute), replacement),),
        implementations=KERNEL_IMPLEMENTATIONS,
        variants=("lite",),
        causes=(cause,),
    )


COMPILE_FAULTS: tuple[CompileFault, ...] = (
    CompileFault(
        _fault(
            "kernel.highest_on_bfloat16",
            "Every dot of bfloat16 operands asks for HIGHEST precision (float32 contraction), "
            "which Mosaic rejects for bfloat16 operands.",
            "mhc_parity.mhc.common",  # the binding the kernels' `matmul` calls
            "dot_precision",
            _highest_on_bfloat16,
            "precision",
        ),
        make_case(batch=8, sequence=64, dtype="bfloat16", branch="mlp", mesh=(8, 1), block_tokens=64),
        "precision",
        paths="compile/v5e/unsharded",
    ),
    CompileFault(
        _fault(
            "kernel.blocks_overflow_vmem",
            "The token blocks asked for are used whether they fit the target's VMEM or not "
            "(no check of the blocks against VMEM).",
            "mhc_parity.mhc.kernels.api",  # the binding `_resolve_blocks` calls
            "fit_blocks",
            _requested_blocks_unchecked,
            "vmem",
        ),
        # 512-token forward blocks of 4 streams × 1024 float32 features: the post-apply step
        # asked libtpu for 33.51 MiB of the 32 MiB scoped limit (KernelConfig.vmem_limit_bytes);
        # fitted, its blocks halve and every program compiles (tests/test_vmem.py).
        make_case(embedding=1024, batch=1, sequence=1024, block_tokens=512),
        "vmem",
        paths="compile/v5e/unsharded",
    ),
    CompileFault(
        _fault(
            "kernel.called_bare_on_sharded_mesh",
            "The kernels are called on token-sharded arrays without the shard_map around them "
            "(MaxText 0.2.5's upstream bug): XLA cannot partition a Mosaic kernel.",
            "mhc_parity.mhc.kernels.api",
            "run_token_sharded",
            _bare_kernel_calls,
            "partitioning",
        ),
        make_case(batch=2, sequence=256, dtype="float32", mesh=(2, 4), block_tokens=64),
        "partitioning",
        paths="compile/v5e/sharded(*)",
    ),
)


def compile_fault_rows(fault: CompileFault, store=None) -> list[dict]:
    """The fault's case's compile rows on its paths, with the fault injected. store: a `CompileStore` (it
    stays open while code is patched: keyed by the lowered module, which the fault changes)."""

    def selects(name: str) -> bool:
        return fnmatch.fnmatchcase(name, fault.paths)

    with fault.perturbation.injected():
        return list(case_compile_rows(fault.case, store, selects))


def caught(fault: CompileFault, rows: list[dict]) -> bool:
    return any(row["verdict"] == "fail" and fault.perturbation.names_its_cause(row["compile_cause"]) for row in rows)
