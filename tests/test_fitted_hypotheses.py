"""Fitted hypotheses (an error of any size per token at one place, `mhc_parity.mhc.oracle_fits`) and the
narrow sums the backend orders itself (`mhc_parity.mhc.oracle_roundings.BACKEND_ORDER`)."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.causes import HypothesisOracle, fitted_in_units
from mhc_parity.harness.engine.oracle_path import leaves_as_draw, named_leaves
from mhc_parity.harness.judging.attribution import (
    FIT_STEPS,
    FittedHypothesis,
    HypothesisErrors,
    attribute_candidate,
    fitted_errors,
    scaled_errors,
)
from mhc_parity.mhc import oracle, oracle_math, rounding_model
from mhc_parity.mhc.operation.oracle_draws import on_fixture
from mhc_parity.mhc.oracle_fits import BACKWARDS, site_response
from mhc_parity.mhc.oracle_roundings import BACKEND_ORDER, Accumulation, accumulation_codes
from mhc_parity.records.schema import UNEXPLAINED_CAUSE

oracle_fits = importlib.import_module("mhc_parity.mhc.oracle_fits")
oracle_roundings = importlib.import_module("mhc_parity.mhc.oracle_roundings")
CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"  # a smooth branch: central differences hold


@pytest.fixture(scope="module")
def setting():
    case = registry.get(CASE)
    return case, make_fixture(case), get_branch(case.branch)


def _leaves(setting, statistic_error=None, pre_offsets=None) -> dict[str, np.ndarray]:
    """The oracle's leaves on the fixture (unjitted, float64), its RMS statistic times
    (1 + statistic_error) where one is given, its pre's outputs plus `pre_offsets`."""
    case, fixture, branch = setting
    with jax.enable_x64(True):
        inputs = oracle._float64_inputs(fixture.x, fixture.weights, fixture.branch_params, fixture.cotangent)
        sites = rounding_model.branch_site_tuple(branch.rounding_sites)
        r = oracle_math.unrounded
        if statistic_error is not None:
            r = oracle_fits._Perturbed("rms_inverse", jnp.asarray(statistic_error, jnp.float64))
        if pre_offsets is not None:
            pre_offsets = tuple(jnp.asarray(o, jnp.float64) for o in pre_offsets)
        outputs = oracle_math.layer_and_vjp(*inputs, r, case.mhc_config(), branch.apply, sites, pre_offsets=pre_offsets)
        return named_leaves(oracle._result(jax.tree.map(lambda a: np.asarray(a, np.float64), outputs)))


def _dot_leaves(a, b) -> float:
    return sum(float(np.vdot(a[k], b[k])) for k in a if k in b)


@pytest.mark.parametrize("backward", BACKWARDS)
def test_a_site_response_is_the_oracle_s_derivative_and_its_transpose_its_adjoint(setting, backward):
    case, fixture, branch = setting
    response = on_fixture(site_response, case, fixture, branch, site="rms_inverse", backward=backward)
    assert response.shape == (case.batch, case.sequence, 1)
    rng = np.random.default_rng(0)
    p = 1e-4 * rng.standard_normal(response.shape)
    change = named_leaves(response.apply(p))
    if backward == "differentiated":
        plus, minus = (_leaves(setting, statistic_error=s * p) for s in (1, -1))
    else:  # the pre's outputs moved by its own derivative, its VJP left exact
        forward = named_leaves(on_fixture(site_response, case, fixture, branch, site="rms_inverse").apply(p))
        offsets = [tuple(s * forward[k] for k in oracle_fits.PRE_OUTPUTS) for s in (1, -1)]
        plus, minus = (_leaves(setting, pre_offsets=o) for o in offsets)
    for leaf, value in change.items():
        central = (plus[leaf] - minus[leaf]) / 2
        np.testing.assert_allclose(value, central, atol=1e-6 * np.abs(value).max() + 1e-300, err_msg=leaf)
    cotangent = {leaf: rng.standard_normal(v.shape) for leaf, v in change.items()}
    back = response.transpose(leaves_as_draw(cotangent))
    assert _dot_leaves(change, cotangent) == pytest.approx(float(np.vdot(p, back)), rel=1e-9)


def test_a_site_that_is_not_fitted_or_an_unknown_backward_is_refused(setting):
    case, fixture, branch = setting
    with pytest.raises(ValueError, match="not fitted"):
        on_fixture(site_response, case, fixture, branch, site="gate")
    with pytest.raises(ValueError, match="backward"):
        on_fixture(site_response, case, fixture, branch, site="rms_inverse", backward="sideways")


def _per_token_error_candidate(setting, scale):
    """A candidate whose RMS statistic is off by a random relative error per token (autodiff
    through it), errors in units of `scale` per leaf; and the exact leaves."""
    exact = _leaves(setting)
    case = setting[0]
    p = 3e-3 * np.random.default_rng(1).standard_normal((case.batch, case.sequence, 1))
    erring = _leaves(setting, statistic_error=p)
    scales = {leaf: scale * float(np.linalg.norm(v)) for leaf, v in exact.items()}
    return scaled_errors({k: erring[k] - exact[k] for k in exact}, scales), scales


def test_a_per_token_error_of_the_rms_statistic_is_fitted_and_named(setting):
    case, fixture, _ = setting
    errors, scales = _per_token_error_candidate(setting, 1e-6)
    fitted = [fitted_in_units(h, r, scales) for h, r in HypothesisOracle().fitted(case, fixture)]
    by_name = {h.name: h for h in fitted}
    fit = fitted_errors(by_name["fit:rms_inverse:differentiated"], errors)
    for leaf, z in errors.items():  # all but the error's second order
        assert 1 - np.sum((z - fit.errors[leaf]) ** 2) / np.sum(z * z) > 0.99, leaf
    found = attribute_candidate(errors, [], list(errors), fitted)
    assert {f.cause_id for f in found.values()} == {"fit:rms_inverse:differentiated"}
    assert all("RMS statistic" in f.cause and f.explained > 0.99 for f in found.values())


def test_an_error_no_per_token_statistic_makes_is_not_fitted(setting):
    case, fixture, _ = setting
    errors, scales = _per_token_error_candidate(setting, 1e-6)
    # One bias gradient 1% off, everything else right: a logic error, not the statistic.
    exact = _leaves(setting)
    broken = {leaf: np.zeros_like(z) for leaf, z in errors.items()}
    broken["d_post_bias"] = 0.01 * exact["d_post_bias"] / scales["d_post_bias"]
    fitted = [fitted_in_units(h, r, scales) for h, r in HypothesisOracle().fitted(case, fixture)]
    found = attribute_candidate(broken, [], ["d_post_bias"], fitted)
    assert found["d_post_bias"].cause_id == UNEXPLAINED_CAUSE  # four numbers: less evidence than freedom
    # The branch input 10% too large and the gates right: the statistic would move the gates too.
    scaled = {leaf: np.zeros_like(z) for leaf, z in errors.items()}
    scaled["layer_input"] = 0.1 * exact["layer_input"] / scales["layer_input"]
    found = attribute_candidate(scaled, [], ["layer_input"], fitted)
    assert found["layer_input"].cause_id == UNEXPLAINED_CAUSE


def test_a_fit_stops_when_a_step_removes_nothing():
    calls = []

    def apply(p):
        calls.append(1)
        return {"a": np.array([p[0], 0.0])}

    def transpose(z):
        return np.array([z["a"][0]])

    h = FittedHypothesis("fit", "a fit", "fit", (1,), apply, transpose)
    # The second number is out of its reach; the first is within a rounding's size (FIT_MAX_RELATIVE).
    fit = fitted_errors(h, {"a": np.array([0.05, 1.0])})
    np.testing.assert_allclose(fit.errors["a"], [0.05, 0.0])
    assert isinstance(fit, HypothesisErrors) and len(calls) < FIT_STEPS


def test_the_backend_s_own_narrow_sum_is_the_sum_a_bfloat16_path_computes():
    rng = np.random.default_rng(4)
    h = jnp.asarray(rng.standard_normal((4, 128, 24)), jnp.bfloat16)
    g = jnp.asarray(0.1 * rng.standard_normal((4, 128, 24)), jnp.bfloat16)
    # A bfloat16 scale's gradient through `scale * h`, as a path computes it on this backend.
    _, pullback = jax.vjp(lambda s: s * h, jnp.asarray(0.7, jnp.bfloat16))
    (path,) = jax.jit(pullback)(g)
    with jax.enable_x64(True):
        summed = oracle_roundings._narrow_sum(
            "bsm,bsm->", jnp.asarray(g, jnp.float64), jnp.asarray(h, jnp.float64), "bfloat16", BACKEND_ORDER
        )
    assert float(summed) == float(path)
    exact = float(np.sum(np.asarray(g, np.float64) * np.asarray(h, np.float64)))
    assert float(summed) != float(jnp.asarray(exact, jnp.bfloat16))  # narrower than rounding once


def test_an_accumulation_of_one_call_names_a_part_the_contraction_has():
    calls = [("gate_scale", "pre"), ("gate_scale", "res"), ("projection", "")]
    only_res = Accumulation("gate_scale", "first_cotangent", "bfloat16", BACKEND_ORDER, parts=("res",))
    options = oracle_roundings.accumulation_options([(only_res,)])
    assert accumulation_codes(calls, [(only_res,)], options)[0, :, 1].tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="no calls named"):
        accumulation_codes(calls, [(Accumulation("gate_scale", "first_cotangent", "bfloat16", 1, ("post",)),)], options)
    with pytest.raises(ValueError, match="BACKEND_ORDER"):
        Accumulation("gate_scale", "first_cotangent", "bfloat16", -1)
