"""Causes a user can act on (issue 67): one bug is named at most one rounding place, consistent
with the leaves that pass, and a logic error's size is no rounding's
(mhc_parity.harness.judging.attribution, mhc_parity.records.cause_consistency)."""

from __future__ import annotations

import dataclasses
import fnmatch

import jax.numpy as jnp
import numpy as np
import pytest
from support import tpu_v5e_terms

from mhc_parity.cases import registry
from mhc_parity.harness.engine import case_judging, oracle_path
from mhc_parity.harness.engine.causes import HypothesisOracle
from mhc_parity.harness.engine.collaborators import Collaborators
from mhc_parity.harness.engine.implementations import BUILTIN, load_implementations
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.faults import matrix as kill_matrix
from mhc_parity.harness.faults.fault_catalogue import FAULTS
from mhc_parity.harness.faults.model import Patch, Perturbation, Seam
from mhc_parity.harness.judging.attribution import FittedHypothesis, HypothesisErrors, attribute_candidate
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records.cause_consistency import (
    NO_SINGLE_WORDS,
    NOT_SEARCHED_ID,
    UNEXPLAINED_WORDS,
    consistent_causes,
    hypothesis_names,
    hypothesis_place,
    located,
)
from mhc_parity.reports.samples import measured_row

# The forward RMS norm's place: a bug in the backward kernel is not there.
RMS_PLACES = {"rms_inverse"}


def _stated(
    perturbation: Perturbation,
    implementations: tuple,
    case_names: tuple[str, ...],
    hypotheses: HypothesisOracle | None = None,
    **plan,
):
    """The rows of `case_names` with `perturbation` injected, as a run states them; implementations:
    built-in names, or `Implementation`s; hypotheses: the causes' hypotheses to share (None: a fresh
    `HypothesisOracle`)."""
    implementations = tuple(BUILTIN[n] if isinstance(n, str) else n for n in implementations)
    plan = PathPlan(implementations=implementations, lowering=False, **plan)
    hypotheses = hypotheses if hypotheses is not None else HypothesisOracle()
    with perturbation.injected():
        rows = [
            row
            for name in case_names
            for row in Runner(load_policy(), Collaborators(hypotheses=hypotheses)).run_case(registry.get(name), plan)
        ]
    return consistent_causes(rows)


NEAR_ZERO_RMS = "lite-n4-c128-b2s64-f32-w32-mlp-near_zero_rms"


@pytest.fixture(scope="module")
def near_zero_rms_hypotheses() -> HypothesisOracle:
    """The causes' hypotheses of NEAR_ZERO_RMS, shared by the two tests of that case as the kill
    matrix shares them across a case's passes (`mhc_parity.harness.faults.passes.SharedInputs`): their
    draws are the float64 oracle's alone, which no seam reaches, so each bug's failing rows are
    matched against the same hypotheses either way; the draws are computed once."""
    return HypothesisOracle()


@pytest.fixture(scope="module")
def chip_hypotheses() -> HypothesisOracle:
    """The causes' hypotheses shared by the gate-cast test's two implementations: one case, each
    run under the same patched backend terms (the chip's), as the kill matrix shares them across a
    case's passes; the draws are computed once."""
    return HypothesisOracle()


def _partials_in_bfloat16(original_accumulate):
    """The pre backward kernel's accumulation with each token block's partial rounded to bfloat16."""
    del original_accumulate

    def accumulate_bf16_partials(ref, value):
        ref[...] += value.astype(jnp.bfloat16).astype(jnp.float32)

    return accumulate_bf16_partials


def _epsilon_ten_times(original_rms_inverse):
    def rms_inverse_epsilon_10x(v, epsilon):
        return original_rms_inverse(v, 10 * epsilon)

    return rms_inverse_epsilon_10x


@pytest.mark.slow
def test_a_backward_accumulator_rounding_names_one_place_at_most_and_not_the_forward_rms_norm(near_zero_rms_hypotheses):
    """Item 1: each block's weight-gradient partial rounded to bfloat16. Every forward leaf
    passes; the gradients were named the gates' gradient rounding, the RMS statistic's sum of
    squares in bfloat16 and no rounding, all at once."""
    bug = Perturbation(
        name="kernel.weight_grad_partials_bf16",
        description="each token block's weight-gradient partial rounded to bfloat16",
        patches=(Patch(Seam("mhc_parity.mhc.kernels.backward", "accumulate"), _partials_in_bfloat16),),
        implementations=("interpret",),
    )
    stated = _stated(bug, ("reference", "interpret"), (NEAR_ZERO_RMS,), near_zero_rms_hypotheses)
    failing = [r for r in stated if r["verdict"] == "fail"]
    assert failing and {r["candidate"].split("/")[0] for r in failing} == {"interpret"}
    assert all(r["leaf"].startswith("d_") for r in failing), "the forward leaves pass"
    places = {hypothesis_place(n) for r in failing for n in hypothesis_names(r["cause_id"])}
    assert len(places) <= 1 and not places & RMS_PLACES, {r["leaf"]: r["cause"] for r in failing}
    assert located(stated)["interpret"].startswith("forward passes; first fails in pre_backward (d_")


@pytest.mark.slow
def test_an_epsilon_ten_times_too_large_names_no_rounding_on_any_row(near_zero_rms_hypotheses):
    """Item 2: the RMS epsilon 10x too large on near-zero tokens (reference path). Every row
    named a rounding; the per-token fit alone took 13 of 20 at 100%, with relative errors of
    0.7 per token, far past what a narrow dtype's statistic makes."""
    bug = Perturbation(
        name="reference.rms_epsilon_10x",
        description="the RMS epsilon 10x too large",
        patches=(Patch(Seam("mhc_parity.mhc.common", "rms_inverse"), _epsilon_ten_times),),
        implementations=("reference",),
    )
    stated = _stated(bug, ("reference",), (NEAR_ZERO_RMS,), near_zero_rms_hypotheses)
    failing = [r for r in stated if r["verdict"] == "fail"]
    assert len(failing) >= 10
    assert all(not hypothesis_names(r["cause_id"]) for r in failing), {r["leaf"]: r["cause"] for r in failing}
    assert all(r["cause"].startswith((UNEXPLAINED_WORDS, NO_SINGLE_WORDS)) for r in failing)
    # `--no-causes`: the same verdicts, and no search (the edit loop's failing run).
    unsearched = _stated(bug, ("reference",), (NEAR_ZERO_RMS,), causes=False)
    assert [r["verdict"] for r in unsearched] == [r["verdict"] for r in stated]
    assert {r["cause_id"] for r in unsearched if r["verdict"] == "fail"} == {NOT_SEARCHED_ID}


@pytest.mark.slow
@pytest.mark.parametrize("implementation", ["reference", "independent"])
def test_a_gate_cast_is_named_on_every_leaf_where_the_chip_s_sensitivity_lets_its_scalar_gradient_pass(
    implementation, monkeypatch, chip_hypotheses
):
    """The TPU v5e's float32 kill matrix (14caf18): gate parameters cast to bfloat16 named their
    own cause on 51% (reference) and 64% (independent) of the failing rows. The chip's widened
    sensitivity lets d_post_scale pass; the cast rounds that gradient once more, to about the
    same bfloat16 value whatever the forward rounding moved it by, so the forward rounding alone
    predicted 22σ where it had 0.4σ, and the pre gate's rounding was ruled out on every leaf. The
    same here with the chip's backend terms, the candidate off the host as there."""
    monkeypatch.setattr(oracle_path, "backend_terms", tpu_v5e_terms)
    monkeypatch.setattr(case_judging, "runs_on_host", lambda path: False)
    fault = FAULTS[f"{implementation}.gate_params_bf16"]
    external = load_implementations(kill_matrix.INDEPENDENT_IMPL) if implementation == "independent" else ()
    stated = _stated(fault, ("reference", *external), ("lite-n4-c128-b2s64-f32-w32-identity-default",), chip_hypotheses)
    failing = [r for r in stated if r["verdict"] == "fail" and r["candidate"].startswith(implementation)]
    assert len({r["leaf"] for r in failing}) >= 8
    causes = {r["leaf"]: r["cause_id"] for r in failing}
    assert all(hypothesis_names(c) for c in causes.values()), causes
    names = {n for c in causes.values() for n in hypothesis_names(c)}
    assert all(any(fnmatch.fnmatch(n, own) for own in fault.causes) for n in names), causes
    assert fnmatch.filter(names, "round:gate_weight/*:cast:bfloat16"), causes


def _failing(case, leaf, cause_id):
    row = measured_row(case, "mosaic/unsharded", "oracle", "vs_oracle", leaf, "weight_grad", "float32", 1.0)
    return {**row, "verdict": "fail", "bound_usage": 50.0, "cause": f"words of {cause_id}", "cause_id": cause_id}


def test_leaves_that_need_several_places_say_no_single_rounding_and_the_kill_matrix_counts_rows():
    """Three places on five leaves, none on more than half: none is named, and the rows say so;
    the kill matrix counts, row by row, the own cause and the confidently wrong ones."""
    gates = "round:gate_weight/pre_and_post_gates:backward:bfloat16"
    projection = "accumulate:projection:second_cotangent:bfloat16:128"
    rms = "accumulate:mean_square:value:bfloat16:term"
    case = registry.get("lite-n4-c256-b2s128-f32-w32-identity-default-bt32-bf128")
    rows = [_failing(case.name, "d_pre_bias", gates), _failing(case.name, "d_post_bias", gates)]
    rows += [_failing(case.name, "d_norm_scale", projection), _failing(case.name, "d_pre_alpha", projection)]
    rows += [_failing(case.name, "d_res_alpha", rms)]
    stated = consistent_causes(rows)
    assert {r["cause_id"] for r in stated} == {"unexplained"}
    assert all(r["cause"].startswith(NO_SINGLE_WORDS + " (not named: words of ") for r in stated)
    fault = FAULTS["kernel.accumulators_reset_every_block"]  # a logic fault: no rounding is its cause
    recorded = kill_matrix._top_cause(fault, rows)
    assert (recorded["own_cause_rows"], recorded["wrong_cause_rows"], recorded["cause_rows"]) == (0, 5, 5)
    (verdict,) = [s for s in kill_matrix.judge(fault, rows, [], [case], 0.0).slices if s.cause_rows]
    assert (verdict.own_cause_rows, verdict.wrong_cause_rows, verdict.own_share) == (5, 0, 1.0)


def test_a_hypothesis_a_passing_leaf_contradicts_is_not_named():
    """It explains the failing leaf exactly but predicts 5σ on a leaf the candidate got right:
    a forward rounding cannot explain a bug whose forward leaves pass. Held to that leaf only
    as a share of the failing leaf's error, it was named at 99.7%."""
    rng = np.random.default_rng(3)
    error = rng.normal(size=64) * 10.0
    candidate = {"d_norm_scale": error, "out": rng.normal(size=64) * 0.01}
    forward = HypothesisErrors("accumulate:mean_square:value:bfloat16:1", "the RMS sum", "mean_square", {
        "d_norm_scale": error, "out": rng.normal(size=64) * 5.0 / 8.0
    })  # fmt: skip
    (found,) = attribute_candidate(candidate, [forward], ["d_norm_scale"]).values()
    assert not found.is_rounding, found
    backward = dataclasses.replace(forward, name="round:gate_weight/g:backward:bfloat16", errors={
        "d_norm_scale": error, "out": np.zeros(64)
    })  # fmt: skip
    (found,) = attribute_candidate(candidate, [backward], ["d_norm_scale"]).values()
    assert found.is_rounding and found.explained > 0.99


def test_a_fitted_error_larger_than_a_narrow_dtype_makes_is_not_named():
    """A per-token fit names the RMS statistic in a narrow dtype only at a rounding's size: a
    relative error of 0.01 per token is, one of 0.7 on a token (an epsilon 10x too large on a
    near-zero token) is not."""
    rng = np.random.default_rng(5)
    sigmas = 1e3 * rng.normal(size=(64, 4))  # the leaf's change in σ per relative error of a token
    fitted = FittedHypothesis(
        "fit:rms_inverse:differentiated",
        "the RMS statistic computed in a narrow dtype",
        "rms_inverse:forward",
        (4,),
        lambda p: {"out": sigmas @ p},
        lambda z: sigmas.T @ z.get("out", np.zeros(64)),
    )
    for p, named in ((np.full(4, 0.01), True), (np.array([0.7, 0.0, 0.01, 0.01]), False)):
        (found,) = attribute_candidate({"out": sigmas @ p}, [], ["out"], [fitted]).values()
        assert found.is_rounding == named, (p, found)
