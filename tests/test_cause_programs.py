"""The hypotheses' oracle programs (issue 67): a gate rounding in the forward pass alone, its
gates' VJP recomputed exactly, and every set of backend primitives in one compiled program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.oracle_path import noise_units
from mhc_parity.harness.faults.fault_catalogue import FAULTS
from mhc_parity.mhc import oracle, oracle_backend, oracle_math
from mhc_parity.mhc.operation.hypotheses import hypotheses, name_problem
from mhc_parity.mhc.operation.oracle_draws import on_fixture
from mhc_parity.mhc.oracle_roundings import Rounding, run_oracle_roundings

CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"
GATES = ("pre_scale", "pre_bias", "post_scale", "post_bias")


@pytest.fixture(scope="module")
def setting():
    case = registry.get(CASE)
    return case, make_fixture(case), get_branch(case.branch)


def _recomputed_by_hand(case, fixture, branch):
    """The layer's leaves with the gate parameters rounded to bfloat16 for the pre's outputs
    only, the pre's VJP at the unrounded ones (what a forward kernel loading them narrow and a
    backward kernel recomputing the gates from the float32 ones compute, in float64)."""
    with jax.enable_x64(True), jax.default_device(oracle.oracle_device()):
        x, w, p, ct = oracle._float64_inputs(fixture.x, fixture.weights, fixture.branch_params, fixture.cotangent)
        rounded = {k: v.astype(jnp.bfloat16).astype(v.dtype) if k in GATES else v for k, v in w.items()}
        config = case.mhc_config()
        moved, moved_coeffs = oracle_math.pre(x, rounded, config)
        exact, exact_coeffs = oracle_math.pre(x, w, config)
        offsets = (moved - exact, *(a - b for a, b in zip(moved_coeffs, exact_coeffs)))
        outputs = oracle_math.layer_and_vjp(
            x, w, p, ct, oracle_math.unrounded, config, branch.apply, pre_offsets=offsets
        )
        return oracle._result(jax.tree.map(lambda a: np.asarray(a, np.float64), outputs))


def test_a_recomputed_gate_rounding_moves_the_forward_and_keeps_the_gates_vjp_exact(setting):
    """kernel.gate_params_bf16 rounds the gates' parameters in the forward kernel only; the
    backward kernel recomputes the gates from the float32 ones. Autodiff through the rounding
    (the "forward" hypothesis) explained under half of d_x and d_norm_scale there."""
    case, fixture, branch = setting
    through, recomputed = on_fixture(
        run_oracle_roundings, case, fixture, branch,
        hypotheses=[(Rounding("gate_weight", d, "bfloat16", GATES),) for d in ("forward", "recomputed")],
    )  # fmt: skip
    expected = _recomputed_by_hand(case, fixture, branch)
    for leaf in ("out", "h_pre", "h_post", "layer_input"):
        np.testing.assert_allclose(recomputed.forward[leaf], through.forward[leaf], rtol=1e-13, atol=1e-15)
    # float64 to some ulps of the leaf's largest value: a weight gradient's sum that cancels to
    # 2e-4 of its terms differs by 1.1e-12 of itself where XLA:CPU fuses multiply-adds (AVX2)
    for got, want in [(recomputed.d_x, expected.d_x)] + [
        (recomputed.d_weights[n], expected.d_weights[n]) for n in ("norm_scale", "pre_alpha", "pre_bias")
    ]:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=2e-15 * np.abs(want).max())
    # The gates' VJP at the unrounded parameters is another gradient than autodiff's.
    moved = np.abs(through.d_x - recomputed.d_x).max()
    assert moved > 1e-3 * np.abs(through.d_x - expected.d_x.astype(ml_dtypes.bfloat16)).max() and moved > 0


def test_a_recomputed_rounding_names_a_weight():
    with pytest.raises(ValueError, match="weight site"):
        Rounding("gate", "recomputed", "bfloat16")


def test_every_set_of_backend_primitives_runs_in_one_compiled_program(setting):
    """A program per set compiled the layer's forward and VJP once per set: seconds each on a
    failing run (bench/causes_bench.py). The primitives are data now; each set's answer is its
    answer alone."""
    case, fixture, branch = setting
    sets = [frozenset({"exp"}), frozenset({"logistic"}), frozenset({"exp", "logistic", "rsqrt"})]
    oracle_backend._backend_program.cache_clear()
    together = on_fixture(oracle_backend.run_oracle_backend, case, fixture, branch, primitives=sets)
    assert oracle_backend._backend_program.cache_info().misses == 1
    alone = on_fixture(oracle_backend.run_oracle_backend, case, fixture, branch, primitives=sets[1:2])
    exact = on_fixture(oracle.run_oracle, case, fixture, branch)
    np.testing.assert_allclose(together[1].d_x, alone[0].d_x, rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(together[1].forward["out"], alone[0].forward["out"], rtol=1e-13, atol=1e-16)
    for result in together:  # each replays a float32 primitive: close to the oracle, not equal
        difference = np.abs(result.forward["out"] - exact.forward["out"]).max()
        assert 0 < difference < 1e-5, difference
    assert not np.array_equal(together[0].forward["out"], together[1].forward["out"])


def test_the_kernel_gate_fault_owns_the_recomputed_rounding_a_case_lists():
    """The kernel's fault names the forward-only rounding its own; the reference's, which
    differentiates through its rounding, does not, and owns the held-narrow form."""
    case = registry.get(CASE)
    names = {h.name for h in hypotheses(case, get_branch(case.branch), noise_units(case))}
    recomputed = "round:gate_weight/pre_and_post_gates:recomputed:bfloat16"
    assert recomputed in names and not name_problem(recomputed)
    assert FAULTS["kernel.gate_params_bf16"].names_its_cause(recomputed)
    assert not FAULTS["reference.gate_params_bf16"].names_its_cause(recomputed)
    # A cast's gradient summed into bfloat16 by the backend (XLA:TPU) is the cast's own.
    held = "round:gate_weight/pre_and_post_gates:forward:bfloat16:backend_sums"
    assert FAULTS["reference.gate_params_bf16"].names_its_cause(held)
