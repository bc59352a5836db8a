"""The float64 oracle at a user's `--xla_cpu_max_isa=AVX2` (FMA, optimisation level 0): its
Sinkhorn max and that max's VJP see one z, so no token's d_x is NaN (docs/jax-notes.md)."""

import json
import platform

import jaxlib
import pytest

from mhc_parity.harness.env import X86_ISA_LEVELS, host_isa
from tests.cli_support import run_python

X86 = platform.machine().lower() in ("x86_64", "amd64")
# On jaxlib 0.10.2 (make test-compat, a TPU VM image's) the barrier does not keep XLA:CPU from
# recomputing z: the same chunk still gives 120 NaNs there (2026-12-07; docs/jax-notes.md).
OLD_JAXLIB = tuple(int(p) for p in jaxlib.__version__.split(".")[:2]) < (0, 12)
LEVELS = [name for name, _ in X86_ISA_LEVELS]

# tests/test_oracle_chunks.py's SINKHORN case in chunks of 5 tokens: before the barrier in
# `oracle_math._sinkhorn`, the chunk of tokens 10-15 gave 120 NaNs in draw 2's d_x. On its 3
# Sinkhorn iterations (as there; the default 20 only add unrolled copies of the step to compile)
# the barrier's removal still gives those 120 NaNs (measured 2026-12-07, jaxlib 0.12.0.1): the
# max and its VJP come before the iterations.
CODE = """
import dataclasses
import json
import numpy as np
from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine import oracle_path
from mhc_parity.mhc.oracle_chunks import run_oracle_chunks

case = Case(name="chunks-sinkhorn", batch=3, sequence=7, streams=3, embedding=40, branch="tanh",
            seed=11, variant="sinkhorn", dtype="bfloat16")
units = oracle_path.noise_units(case)
fixture, branch = make_fixture(case), get_branch(case.branch)
chunks = run_oracle_chunks(
    fixture.x, fixture.weights, branch.apply, fixture.branch_params, fixture.cotangent,
    dataclasses.replace(case.mhc_config(), sinkhorn_iterations=3),
    draws=[(0, None), (3, units), (4, units), (None, units)], chunk_tokens=5, branch_sites=branch.rounding_sites,
)
print(json.dumps([int(np.count_nonzero(~np.isfinite(r.d_x))) for chunk in chunks for r in chunk.results]))
"""


@pytest.mark.skipif(not X86, reason="--xla_cpu_max_isa names x86 levels")
@pytest.mark.xfail(OLD_JAXLIB, reason="jaxlib < 0.12 still recomputes z at AVX2 (docs/jax-notes.md)", strict=True)
def test_the_chunked_sinkhorn_oracle_at_avx2_has_no_nan():
    if host_isa() not in LEVELS or LEVELS.index(host_isa()) < LEVELS.index("AVX2"):
        pytest.skip(f"this host's newest instruction set is {host_isa() or 'unknown'}")
    proc = run_python(CODE, xla_flags="--xla_cpu_max_isa=AVX2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(counts) == 5 * 4 and counts == [0] * len(counts), counts
