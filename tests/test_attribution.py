"""A failing row's cause: the explained fraction and its choices (mhc_parity.harness.judging.attribution),
the oracle's deterministic roundings (mhc_parity.mhc.oracle_roundings), the operation's hypotheses
(mhc_parity.mhc.operation.hypotheses), and the rows the runner annotates (mhc_parity.harness.engine.causes)."""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.causes import HypothesisOracle, annotate_causes
from mhc_parity.harness.engine.implementations import BUILTIN
from mhc_parity.harness.engine.oracle_path import noise_units
from mhc_parity.harness.faults import passes
from mhc_parity.harness.faults.model import Patch, Perturbation, Seam
from mhc_parity.harness.judging.attribution import (
    BY_SIZE,
    EXPLAINED_THRESHOLD,
    UNEXPLAINED,
    UNEXPLAINED_ID,
    FittedHypothesis,
    HypothesisErrors,
    along,
    attribute_candidate,
    judged_statistics,
    size_ranges,
    token_means,
)
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.mhc import oracle, rounding_model
from mhc_parity.mhc.operation.hypotheses import Hypothesis
from mhc_parity.mhc.operation.oracle_draws import on_fixture
from mhc_parity.mhc.oracle_fits import FITTED_SITES
from mhc_parity.mhc.oracle_roundings import (
    BACKEND_ORDER,
    PADDED_HYPOTHESES,
    PADDED_SUMS,
    Accumulation,
    Rounding,
    rounding_codes,
    run_oracle_roundings,
)
from mhc_parity.records.rows import to_frame
from mhc_parity.records.schema import empty_row
from mhc_parity.reports import render_html
from mhc_parity.reports.causes import cause_groups
from mhc_parity.reports.gate.rule import gate

hypotheses_module = importlib.import_module("mhc_parity.mhc.operation.hypotheses")
causes_module = importlib.import_module("mhc_parity.harness.engine.causes")
oracle_roundings = importlib.import_module("mhc_parity.mhc.oracle_roundings")
CASE = "lite-n4-c128-b2s64-f32-w32-mlp-near_zero_rms"
BF16_CASE = "lite-n4-c128-b2s64-bf16-w32-mlp-mixed_signs"


def _rng():
    return np.random.default_rng(7)


# ── the explained fraction and the choice of a cause ──────────────────────────────────


def _hypothesis(name, errors, family=None):
    return HypothesisErrors(name, f"words of {name}", family or name, errors)


def _attribute(candidate, hypotheses, failing=("leaf",)):
    return attribute_candidate(candidate, hypotheses, list(failing))


def _fraction(candidate_error, hypothesis_error) -> float:
    """The explained fraction of one hypothesis on a candidate's one leaf (no other leaves)."""
    (found,) = _attribute({"leaf": candidate_error}, [_hypothesis("h", {"leaf": hypothesis_error})]).values()
    return found.explained


def test_explained_fraction_is_one_for_the_same_error_and_zero_for_none():
    e = _rng().normal(size=(4, 8))
    assert _fraction(e, e) == 1.0
    assert _fraction(e, np.zeros_like(e)) == 0.0
    assert _fraction(e, 3 * e) == pytest.approx(-3.0)  # worse than no error at all
    assert np.isnan(_fraction(np.zeros(3), np.ones(3)))


def test_the_matching_hypothesis_is_named_among_unrelated_ones():
    rng = _rng()
    bug = rng.normal(size=256)
    hypotheses = [_hypothesis(f"h{i}", {"leaf": rng.normal(size=256)}) for i in range(6)]
    hypotheses.append(_hypothesis("bug", {"leaf": bug}))
    (found,) = _attribute({"leaf": bug + 0.05 * rng.normal(size=256)}, hypotheses).values()
    assert found.cause == "words of bug" and found.names == ("bug",) and found.explained > 0.99


def test_two_hypotheses_at_different_places_are_named_where_one_is_not_enough():
    rng = _rng()
    a, b = rng.normal(size=256), rng.normal(size=256)
    hypotheses = [
        _hypothesis("a", {"leaf": a}),
        _hypothesis("b", {"leaf": b}),
        _hypothesis("c", {"leaf": rng.normal(size=256)}),
    ]
    (found,) = _attribute({"leaf": a + b}, hypotheses).values()
    assert set(found.names) == {"a", "b"} and found.cause_id in ("a+b", "b+a") and found.explained > 0.99
    same_place = [_hypothesis("a", {"leaf": a}, "site"), _hypothesis("b", {"leaf": b}, "site")]
    (found,) = _attribute({"leaf": a + b}, same_place).values()
    assert len(found.names) < 2  # one place rounded twice is one rounding


def test_an_error_no_rounding_explains_is_unexplained_with_the_best_fraction():
    rng = _rng()
    e = rng.normal(size=256)
    hypotheses = [
        _hypothesis("x", {"leaf": 0.3 * e + rng.normal(size=256)}),
        _hypothesis("y", {"leaf": rng.normal(size=256)}),
    ]
    (found,) = _attribute({"leaf": e}, hypotheses).values()
    assert found.cause == UNEXPLAINED and found.cause_id == UNEXPLAINED_ID and found.names == ()
    assert found.explained < EXPLAINED_THRESHOLD and found.best == "words of x"


def test_a_hypothesis_that_breaks_a_leaf_the_candidate_got_right_is_not_its_cause():
    rng = _rng()
    small = rng.normal(size=4)  # a bias gradient of four numbers, 1% off
    chance = _hypothesis("chance", {"leaf": small, "out": 5 * rng.normal(size=512)})
    candidate = {"leaf": small, "out": 0.01 * rng.normal(size=512)}
    (found,) = _attribute(candidate, [chance]).values()
    assert found.cause == UNEXPLAINED  # it matches the four numbers, and predicts an error on `out`
    consistent = _hypothesis("consistent", {"leaf": small, "out": np.zeros(512)})
    (found,) = _attribute(candidate, [chance, consistent]).values()
    assert found.names == ("consistent",) and found.explained == pytest.approx(1.0)


def test_a_tie_goes_to_the_hypothesis_that_explains_the_other_failing_leaves():
    rng = _rng()
    e1, e2 = rng.normal(size=64), rng.normal(size=64)
    narrow = _hypothesis("narrow", {"one": e1, "two": np.zeros(64)})
    broad = _hypothesis("broad", {"one": e1, "two": e2})
    found = _attribute({"one": e1, "two": e2}, [narrow, broad], failing=("one", "two"))
    assert found["one"].names == ("broad",) and found["two"].names == ("broad",)


@pytest.mark.parametrize(
    "view", [along(np.array([[0.6, 0.0], [0.8, 0.0]])), token_means((2, 2), 1)], ids=["gain", "tokens"]
)
def test_a_judged_statistic_is_an_orthonormal_projection_of_the_leaf(view):
    rng = _rng()
    z, v = rng.normal(size=(2, 2)), rng.normal(size=np.size(view.project(np.zeros((2, 2)))))
    assert view.expand(v).shape == (2, 2)  # back in the leaf's shape
    assert np.allclose(view.project(view.expand(v)), v)  # orthonormal rows: P Pᵀ = 1
    assert _dot_all(view.project(z), v) == pytest.approx(_dot_all(z, view.expand(v)))  # Pᵀ is P's adjoint
    leaf = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert np.allclose(token_means((2, 2), 1).project(leaf), np.array([4.0, 6.0]) / np.sqrt(2))


def _dot_all(a, b):
    return float(np.dot(np.ravel(a), np.ravel(b)))


def test_a_shift_shared_by_every_token_is_named_on_its_token_means_and_fitted_through_them():
    rng = _rng()
    tokens, width = 256, 4
    shift = 0.5 * rng.normal(size=width)  # below the leaf's noise, shared by every token
    candidate = {"leaf": rng.normal(size=(tokens, width)) + shift, "passing": 0.01 * rng.normal(size=8)}
    biased = _hypothesis("biased", {"leaf": np.broadcast_to(shift, (tokens, width)), "passing": np.zeros(8)})
    noise = _hypothesis("noise", {"leaf": rng.normal(size=(tokens, width)), "passing": np.zeros(8)})
    (whole,) = _attribute(candidate, [biased, noise], failing=("leaf",)).values()
    assert whole.names == ()  # value for value the noise hides the shift
    fitted = FittedHypothesis(
        "fit",
        "words of fit",
        "fit",
        (width,),
        apply=lambda p: {"leaf": np.broadcast_to(p, (tokens, width)), "passing": np.zeros(8)},
        transpose=lambda z: np.asarray(z["leaf"]).reshape(tokens, width).sum(axis=0),
    )
    errors, hypotheses, fits = judged_statistics(
        candidate, [biased, noise], [fitted], {"leaf": token_means((tokens, width), 1)}
    )
    assert errors["leaf"].shape == (width,) and errors["passing"] is candidate["passing"]
    (found,) = _attribute(errors, hypotheses, failing=("leaf",)).values()
    assert found.names == ("biased",) and found.explained > EXPLAINED_THRESHOLD
    (fit,) = fits
    p = rng.normal(size=width)
    # the fitted hypothesis keeps its adjoint through the view: ⟨apply(p), z⟩ = ⟨p, transpose(z)⟩
    z = {"leaf": rng.normal(size=width), "passing": rng.normal(size=8)}
    lhs = sum(_dot_all(fit.apply(p)[leaf], z[leaf]) for leaf in z)
    assert lhs == pytest.approx(_dot_all(p, fit.transpose(z)))


def test_a_variant_no_failing_leaf_tells_from_its_plain_form_is_named_in_the_plain_form():
    rng = _rng()
    forward, weight = rng.normal(size=64), 3 * rng.normal(size=16)

    def pair(plain_weight, variant_weight):
        plain = _hypothesis("plain", {"out": forward, "d_scale": np.array([-1.0]), "d_weight": plain_weight})
        variant = _hypothesis("variant", {"out": forward, "d_scale": np.array([1.0]), "d_weight": variant_weight})
        return [plain, dataclasses.replace(variant, variant_of="plain")]

    # both explain the failing `out`; only a passing scalar, within its noise (1 σ), prefers the variant
    candidate = {"out": forward, "d_scale": np.array([1.0]), "d_weight": np.zeros(16)}
    (found,) = _attribute(candidate, pair(np.zeros(16), np.zeros(16)), failing=("out",)).values()
    assert found.names == ("plain",) and found.explained == pytest.approx(1.0)  # the variant's score
    # a failing gradient leaf that tells them apart keeps the variant
    candidate = {"out": forward, "d_scale": np.array([1.0]), "d_weight": -weight}
    found = _attribute(candidate, pair(weight, -weight), failing=("out", "d_weight"))
    assert found["out"].names == ("variant",) and found["d_weight"].names == ("variant",)


# ── the oracle's deterministic roundings ──────────────────────────────────────────────


@pytest.fixture(scope="module")
def setting():
    case = registry.get(CASE)
    return case, make_fixture(case), get_branch(case.branch)


def _on_fixture(run, setting, weights=None, **options):
    case, fixture, branch = setting
    if weights is not None:
        fixture = dataclasses.replace(fixture, weights=weights)
    return on_fixture(run, case, fixture, branch, **options)


def _run(setting, hypotheses, weights=None):
    return _on_fixture(run_oracle_roundings, setting, weights, hypotheses=hypotheses)


def _exact(setting, weights=None):
    return _on_fixture(oracle.run_oracle, setting, weights)


def test_a_rounded_weight_is_the_oracle_on_that_weight_rounded(setting):
    _, fixture, _ = setting
    weights = dict(fixture.weights)
    rounded = {**weights, "pre_bias": np.asarray(weights["pre_bias"]).astype(ml_dtypes.bfloat16)}
    nothing, pre_bias = _run(setting, [(), (Rounding("gate_weight", "forward", "bfloat16", ("pre_bias",)),)])
    exact, expected = _exact(setting), _exact(setting, rounded)
    for leaf in ("out", "h_pre", "h_post"):
        np.testing.assert_allclose(nothing.forward[leaf], exact.forward[leaf], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(pre_bias.forward[leaf], expected.forward[leaf], rtol=1e-13, atol=1e-15)
    assert np.abs(pre_bias.forward["h_pre"] - exact.forward["h_pre"]).max() > 1e-5  # it did round
    np.testing.assert_array_equal(pre_bias.forward["h_post"], nothing.forward["h_post"])  # only the pre gate


def test_a_rounded_cotangent_rounds_the_gradient_it_becomes(setting):
    rounded, pre_alpha = _run(
        setting, [(Rounding("x", "backward", "bfloat16"),), (Rounding("matmul_weight", "backward", "bfloat16"),)]
    )
    exact = _exact(setting)
    grad = exact.d_weights["pre_alpha"]
    np.testing.assert_array_equal(pre_alpha.d_weights["pre_alpha"], grad.astype(ml_dtypes.bfloat16).astype(np.float64))
    expected = exact.d_x.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(rounded.d_x, expected)
    np.testing.assert_allclose(rounded.forward["out"], exact.forward["out"], rtol=1e-13, atol=1e-15)


def test_a_rounding_names_a_known_site_and_values_it_has():
    calls = [("gate_weight", (1,), "pre_bias"), ("gate", (2,), "")]
    with pytest.raises(ValueError, match="no rounding site"):
        rounding_codes(calls, [(Rounding("nowhere", "forward", "bfloat16"),)], {"gate_weight", "gate"})
    with pytest.raises(ValueError, match="no values named"):
        rounding_codes(calls, [(Rounding("gate_weight", "forward", "bfloat16", ("res_bias",)),)], {"gate_weight"})
    with pytest.raises(ValueError, match="direction"):
        Rounding("gate", "sideways", "bfloat16")
    codes = rounding_codes(calls, [(Rounding("gate", "backward", "float32"),)], {"gate_weight", "gate"})
    assert codes.tolist() == [[[0, 0, 0], [0, 3, 0]]]


# ── the operation's hypotheses ────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", [CASE, BF16_CASE])
def test_the_hypotheses_are_the_roundings_the_model_does_not_allow(name):
    case = registry.get(name)
    branch = get_branch(case.branch)
    units = noise_units(case)
    found = hypotheses_module.hypotheses(case, branch, units)
    assert len({h.name for h in found}) == len(found)
    sites = {**rounding_model.ROUNDING_SITES, **dict(branch.rounding_sites)}
    for h in found:
        if h.kind == "fitted":
            assert not h.roundings and h.site in FITTED_SITES, h.name
            continue
        if h.kind == hypotheses_module.BACKEND_KIND:
            # The backend's own primitives: replayed through the oracle, no rounding of the model.
            assert not h.roundings and set(h.primitives) <= set(hypotheses_module.REPLAYED), h.name
            assert set(h.primitives) <= set(hypotheses_module.case_primitives(case, branch)), h.name
            continue
        if h.name.endswith(":backend_sums"):
            # The gate parameters held narrow: rounded, and their gradients summed narrowly.
            rounding, *sums = h.roundings
            assert {s.contraction for s in sums} == set(hypotheses_module.GATE_CONTRACTIONS), h.name
            assert all(s.block == BACKEND_ORDER and s.dtype == rounding.dtype for s in sums), h.name
            assert {p.split("_")[0] for p in rounding.parts} == {g for s in sums for g in s.parts}, h.name
        elif h.name.split(":")[2] == hypotheses_module.CAST:
            # A cast: the gate parameters rounded, and their gradients by its VJP.
            rounding, gradient = h.roundings
            assert (rounding.direction, gradient.direction) == ("forward", "backward"), h.name
            assert dataclasses.replace(gradient, direction="forward") == rounding, h.name
        else:
            (rounding,) = h.roundings
        if isinstance(rounding, Accumulation):
            # Summed narrower than the float32 a correct path accumulates in; a whole sum
            # rounded once is matched value for value, a running narrow sum by size.
            assert float(jnp.finfo(rounding.dtype).eps) > float(jnp.finfo("float32").eps), h.name
            same_sum = [g.roundings[0] for g in found if g.family == h.family and g.kind != "fitted"]
            widest = max(r.block for r in same_sum if r.dtype == rounding.dtype)
            assert h.kind == ("rounding" if rounding.block == widest else "accumulation"), h.name
            continue
        assert h.kind == "rounding"
        site = sites[rounding.site]
        classes = site.forward if rounding.direction == "forward" else site.backward
        allowed = max((units[c] for c in classes), default=0.0)
        assert float(jnp.finfo(rounding.dtype).eps) / 2 > allowed, h.name
    names = {h.name for h in found}
    assert "round:gate_weight/pre_gate:forward:bfloat16" in names
    assert "round:gate_weight/residual_gate:forward:bfloat16" in names
    # bfloat16 runs may round their stored values to bfloat16: no such hypothesis there.
    assert ("round:layer_input:forward:bfloat16" in names) == (case.dtype == "float32")
    assert "accumulate:projection:second_cotangent:bfloat16:1" in names  # a weight gradient over the tokens
    assert not any(n.startswith("accumulate:permutation_mix:second_cotangent") for n in names)  # a constant
    assert not any(n.startswith("round:gate_weight/all") for n in names)  # a pair of the gates, named apart
    residual, pre = (
        next(h for h in found if h.name == n)
        for n in ("round:gate_weight/residual_gate:forward:bfloat16", "round:gate_weight/pre_gate:forward:bfloat16")
    )
    assert residual.family != pre.family  # so they may pair
    # float32 and bfloat16 cases share each program: the roundings' and the narrow sums'
    drawn = [h for h in found if h.kind != "fitted"]
    summed = [h for h in drawn if any(isinstance(r, Accumulation) for r in h.roundings)]
    assert len(drawn) - len(summed) <= PADDED_HYPOTHESES and len(summed) <= PADDED_SUMS


def test_the_orders_of_one_sum_span_each_others_sizes():
    small = HypothesisErrors("blocks", "w", "sum", {"a": np.full(4, 1.0)}, by_size=True)
    large = HypothesisErrors("terms", "w", "sum", {"a": np.full(4, 3.0)}, by_size=True)
    alone = HypothesisErrors("other", "w", "other", {"a": np.full(4, 2.0)}, by_size=True)
    by_name = {h.name: h for h in size_ranges([small, large, alone, _hypothesis("value", {"a": np.ones(4)})])}
    assert by_name["blocks"].scale_range == pytest.approx((1.0, 3.0))
    assert by_name["terms"].scale_range == pytest.approx((1 / 3, 1.0))
    assert by_name["other"].scale_range == by_name["value"].scale_range == (1.0, 1.0)


def _bf16(values):
    return np.asarray(values, np.float64).astype(ml_dtypes.bfloat16).astype(np.float64)


def test_a_narrow_sum_rounds_its_running_total_after_each_block():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(2, 300)), rng.normal(size=(300, 3))
    for block in (1, 7, 300):
        expected = np.zeros(3)
        for start in range(0, 300, block):
            expected = _bf16(expected + a[0, start : start + block] @ b[start : start + block])
        with jax.enable_x64(True):
            got = oracle_roundings._narrow_sum("bk,kn->bn", jnp.asarray(a), jnp.asarray(b), "bfloat16", block)
        np.testing.assert_array_equal(np.asarray(got)[0], expected)
    # Summed in bfloat16 term by term, 300 ones stop at 256: the running total's spacing is 2 there.
    with jax.enable_x64(True):
        ones = oracle_roundings._narrow_sum("k,k->", jnp.ones(300), jnp.ones(300), "bfloat16", 1)
    assert float(ones) == 256.0


def test_an_accumulated_weight_gradient_is_its_sum_over_the_tokens_in_bfloat16():
    case = registry.get(BF16_CASE)
    fixture, branch = make_fixture(case), get_branch(case.branch)
    exact, summed = on_fixture(
        run_oracle_roundings, case, fixture, branch,
        hypotheses=[(), (Accumulation("projection", "second_cotangent", "bfloat16", 1),)],
    )  # fmt: skip
    # Only the weight gradients the projection's tokens sum into move; the forward does not.
    for leaf, value in exact.forward.items():
        np.testing.assert_allclose(summed.forward[leaf], value, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(summed.d_x, exact.d_x, rtol=1e-12, atol=1e-300)
    moved = {k for k in exact.d_weights if not np.allclose(summed.d_weights[k], exact.d_weights[k], rtol=1e-12)}
    assert moved == {"pre_alpha", "post_alpha", "res_alpha"}
    error = np.abs(summed.d_weights["pre_alpha"] - exact.d_weights["pre_alpha"]).max()
    assert error > 2**-8 * np.abs(exact.d_weights["pre_alpha"]).max()  # more than one bfloat16 rounding


def test_a_sum_is_matched_by_its_size_on_every_unexplained_leaf_at_once():
    rng = _rng()
    sizes = {"a": 3.0, "b": 1.0, "c": 0.5}
    candidate = {leaf: size * rng.normal(size=64) for leaf, size in sizes.items()}
    same_sizes = {leaf: size * rng.normal(size=64) for leaf, size in sizes.items()}  # other values
    other_sizes = {leaf: size * rng.normal(size=64) for leaf, size in zip(sizes, (0.5, 1.0, 3.0))}
    hypotheses = [
        HypothesisErrors("sum", "the sum", "sum", same_sizes, by_size=True),
        HypothesisErrors("other", "the other sum", "other", other_sizes, by_size=True),
        _hypothesis("value", {leaf: rng.normal(size=64) for leaf in sizes}),
    ]
    found = attribute_candidate(candidate, hypotheses, list(sizes))
    assert {f.cause_id for f in found.values()} == {"sum"}
    assert all(f.cause.endswith(BY_SIZE) and f.explained > 0.9 for f in found.values())
    # One leaf's size matched by chance is not enough: the sizes must hold on every leaf.
    shuffled = [HypothesisErrors("sum", "the sum", "sum", other_sizes, by_size=True)]
    assert {f.cause_id for f in attribute_candidate(candidate, shuffled, list(sizes)).values()} == {UNEXPLAINED_ID}
    # One unexplained leaf is not enough to match sizes on: any leaf's size is some sum's by chance.
    one = attribute_candidate({"a": candidate["a"]}, hypotheses[:1], ["a"])
    assert one["a"].cause_id == UNEXPLAINED_ID
    # The same sum in another order may be off by the factor its orders span, and no more.
    fifth = [dataclasses.replace(hypotheses[0], errors={k: v / 5 for k, v in same_sizes.items()})]
    assert {f.cause_id for f in attribute_candidate(candidate, fifth, list(sizes)).values()} == {UNEXPLAINED_ID}
    ranged = [dataclasses.replace(fifth[0], scale_range=(1.0, 6.0))]
    assert all(f.explained > 0.9 for f in attribute_candidate(candidate, ranged, list(sizes)).values())
    # A hypothesis explained value for value comes first.
    exact = [*hypotheses, _hypothesis("rounding", candidate)]
    assert {f.cause_id for f in attribute_candidate(candidate, exact, list(sizes)).values()} == {"rounding"}


# ── the rows the runner annotates ─────────────────────────────────────────────────────


class _CountingHypotheses(HypothesisOracle):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __call__(self, case, fixture):
        self.calls += 1
        return super().__call__(case, fixture)


def _row(leaf, verdict, comparison="vs_oracle", usage=2.0):
    return empty_row(
        case=CASE, candidate="kernel/unsharded", partner="oracle", comparison=comparison, leaf=leaf, verdict=verdict,
        bound_usage=usage,
    )  # fmt: skip


def test_failing_rows_get_the_rounding_that_made_them_and_passing_cases_compute_nothing(setting):
    case, fixture, branch = setting
    hypotheses = _CountingHypotheses()
    (exact, rounded) = [
        {**draw.forward, "d_x": draw.d_x}
        for draw in _run(setting, [(), (Rounding("gate_weight", "forward", "bfloat16", ("post_scale", "post_bias")),)])
    ]
    exact_leaves = {"h_post": exact["h_post"], "d_x": exact["d_x"]}
    sensitivity = {
        leaf: Sensitivity(max=1e-6, rms=1e-6, gain=1e-6, dof_max=64, dof_rms=64, draws=16) for leaf in exact_leaves
    }
    # A candidate with the bug: both leaves carry it.
    candidate = {"kernel/unsharded": {"h_post": rounded["h_post"].astype(np.float32), "d_x": rounded["d_x"]}}
    inputs = dict(
        oracle_leaves=exact_leaves, oracle_sensitivity=sensitivity, candidate_leaves=candidate, hypotheses=hypotheses
    )
    passing = [_row("h_post", "pass", usage=0.3), _row("d_x", "pass", usage=0.2)]
    assert (
        annotate_causes(
            passing,
            case,
            fixture,
            **inputs,
        )
        == passing
    )
    assert hypotheses.calls == 0
    rows = [_row("h_post", "fail"), _row("d_x", "pass", usage=0.2)]
    annotated = annotate_causes(
        rows,
        case,
        fixture,
        **inputs,
    )
    assert hypotheses.calls == 1
    assert annotated[0]["cause_id"] == "round:gate_weight/post_gate:forward:bfloat16"
    assert annotated[0]["cause"] == "the post gate's scale and bias rounded to bfloat16"
    assert annotated[0]["cause_explained"] > 0.99 and annotated[1]["cause"] == ""


class _StubHypotheses(HypothesisOracle):
    """Two drawn hypotheses with made-up leaves (no oracle runs), answered per case."""

    def __init__(self):
        super().__init__()
        self.answers = 0

    def _answer(self, case, fixture):
        with self._lock:
            if self._latest is not None and self._latest[0] == case:
                return self._latest[1]
        self.answers += 1
        drawn = [
            Hypothesis(f"round:{site}:forward:bfloat16", site, "rounding", f"{site}:forward", ())
            for site in ("one", "two")
        ]
        leaves = [{"out": np.full(4, 1.0 + i), "d_x": np.full(3, 2.0 + i)} for i in range(2)]
        answer = (drawn, leaves, [])
        with self._lock:
            if self._latest is None or self._latest[0] != case:
                self._units.clear()
            self._latest = (case, answer)
        return answer


def test_the_hypotheses_errors_in_units_are_kept_for_a_cases_runs():
    """The kill matrix's passes of a case share one `HypothesisOracle`: its hypotheses' errors
    against the oracle answer, in units of the σ a candidate is judged in, are computed once per
    case, answer and scales, and never served for another answer or case."""
    hypotheses, oracle_leaves = _StubHypotheses(), {"out": np.zeros(4), "d_x": np.ones(3)}
    scales = {"out": 0.5, "d_x": 2.0}
    first = hypotheses.in_units("case-a", None, oracle_leaves, scales)
    assert [h.name for h in first] == ["round:one:forward:bfloat16", "round:two:forward:bfloat16"]
    np.testing.assert_array_equal(first[1].errors["out"], np.full(4, 4.0))  # (2 - 0) / 0.5
    np.testing.assert_array_equal(first[0].errors["d_x"], np.full(3, 0.5))  # (2 - 1) / 2
    assert hypotheses.in_units("case-a", None, oracle_leaves, dict(scales)) is first
    widened = hypotheses.in_units("case-a", None, oracle_leaves, {"out": 1.0, "d_x": 2.0})
    assert widened is not first and widened[1].errors["out"][0] == 2.0
    other_answer = {"out": np.ones(4), "d_x": np.ones(3)}  # another object: computed against it
    assert hypotheses.in_units("case-a", None, other_answer, scales)[1].errors["out"][0] == 2.0
    assert hypotheses.answers == 1
    again = hypotheses.in_units("case-b", None, oracle_leaves, scales)  # a new case drops the old one's
    assert again is not first and hypotheses.answers == 2
    assert hypotheses.in_units("case-a", None, oracle_leaves, scales) is not first


class _HostOrderHypotheses(HypothesisOracle):
    """One hypothesis, a gate rounding whose gradients the draws' backend sums narrowly: right
    on `d_res_alpha`, and on `d_res_bias` the error of the host's order of that sum."""

    def _answer(self, case, fixture):
        gate = Hypothesis(
            "round:gate_weight/residual_gate:forward:bfloat16:backend_sums", "the residual gate's casts",
            "rounding", "gate_weight/residual:forward", (), ordered=True, backend_sum_weights=("res_scale", "res_bias"),
        )  # fmt: skip
        leaves = {"d_res_alpha": 2.0 + np.linspace(-1.0, 1.0, 64), "d_res_bias": np.full(4, 2.0 + 5.0)}
        return [gate], [leaves], []


def test_a_sum_in_the_hosts_order_is_not_held_to_the_leaves_it_makes_on_another_backend():
    """A chip sums a narrow gradient in its own order, not the host's the hypotheses are drawn
    in: a candidate there whose `d_res_bias` carries its own order's error is still named by the
    rounding that explains its failing leaf; on the host the same leaves disqualify it."""
    oracle_leaves = {"d_res_alpha": np.full(64, 2.0), "d_res_bias": np.full(4, 2.0)}
    sensitivity = {
        leaf: Sensitivity(max=0.1, rms=0.1, gain=0.1, dof_max=64, dof_rms=64, draws=16) for leaf in oracle_leaves
    }
    leaves = {"d_res_alpha": 2.0 + np.linspace(-1.0, 1.0, 64), "d_res_bias": np.full(4, 2.0 - 3.0)}
    rows = [
        empty_row(case=CASE, candidate=name, partner="oracle", comparison="vs_oracle", leaf=leaf, verdict=verdict)
        for name in ("layer/unsharded", "layer/unsharded@cpu")
        for leaf, verdict in (("d_res_alpha", "fail"), ("d_res_bias", "pass"))
    ]
    annotated = annotate_causes(
        rows, registry.select(names=CASE)[0], None, oracle_leaves=oracle_leaves, oracle_sensitivity=sensitivity,
        candidate_leaves={"layer/unsharded": leaves, "layer/unsharded@cpu": leaves},
        hypotheses=_HostOrderHypotheses(), elsewhere={"layer/unsharded"},
    )  # fmt: skip
    chip, host = annotated[0], annotated[2]
    assert chip["cause_id"] == "round:gate_weight/residual_gate:forward:bfloat16:backend_sums"
    assert chip["cause_explained"] == pytest.approx(1.0)
    assert host["cause_id"] == UNEXPLAINED_ID and host["cause_explained"] < 0


class _CastHypotheses(HypothesisOracle):
    """One hypothesis, a gate cast: right on `d_res_alpha`; on `d_res_bias` the host's one
    rounding of the summed gradient, 0.5."""

    def _answer(self, case, fixture):
        cast = Hypothesis(
            "round:gate_weight/residual_gate:cast:bfloat16", "the residual gate's cast", "rounding",
            "gate_weight/residual:forward", (), backend_sum_weights=("res_scale", "res_bias"),
        )  # fmt: skip
        leaves = {"d_res_alpha": 2.0 + np.linspace(-1.0, 1.0, 64), "d_res_bias": np.full(4, 2.0 + 0.5)}
        return [cast], [leaves], []


@pytest.mark.parametrize("bias_error, named", [(2.0, True), (-2.0, True), (None, False)])
def test_a_cast_gradient_summed_narrowly_elsewhere_is_named_by_its_size_up_to_the_square_root_of_the_tokens(
    bias_error, named
):
    """XLA:TPU folds a cast into the sum of its gradient, rounding in its own order: a chip's
    bias gradient erred 3-6x the host's one rounding (issue 67). Off the host, an error up to
    √tokens times the host's is named the cast, by size; on the host, where the draw is the
    program's own sum, the values must match; beyond √tokens it is no narrow sum's."""
    case = registry.select(names=CASE)[0]
    if bias_error is None:
        bias_error = 0.5 * 1.5 * np.sqrt(case.tokens)
    oracle_leaves = {"d_res_alpha": np.full(64, 2.0), "d_res_bias": np.full(4, 2.0)}
    sensitivity = {
        leaf: Sensitivity(max=0.1, rms=0.1, gain=0.1, dof_max=64, dof_rms=64, draws=16) for leaf in oracle_leaves
    }
    leaves = {"d_res_alpha": 2.0 + np.linspace(-1.0, 1.0, 64), "d_res_bias": np.full(4, 2.0 + bias_error)}
    rows = [
        empty_row(case=CASE, candidate=name, partner="oracle", comparison="vs_oracle", leaf=leaf, verdict="fail")
        for name in ("layer/unsharded", "layer/unsharded@cpu")
        for leaf in ("d_res_alpha", "d_res_bias")
    ]
    annotated = annotate_causes(
        rows, case, None, oracle_leaves=oracle_leaves, oracle_sensitivity=sensitivity,
        candidate_leaves={"layer/unsharded": leaves, "layer/unsharded@cpu": leaves},
        hypotheses=_CastHypotheses(), elsewhere={"layer/unsharded"},
    )  # fmt: skip
    chip_bias, host_bias = annotated[1], annotated[3]
    assert annotated[0]["cause_id"] == annotated[2]["cause_id"] == "round:gate_weight/residual_gate:cast:bfloat16"
    assert host_bias["cause_id"] == UNEXPLAINED_ID
    if named:
        assert chip_bias["cause_id"] == "round:gate_weight/residual_gate:cast:bfloat16"
        assert chip_bias["cause"].endswith(BY_SIZE)
    else:
        assert chip_bias["cause_id"] == UNEXPLAINED_ID


def test_a_case_too_large_for_the_hypotheses_says_so(setting, monkeypatch):
    case, fixture, _ = setting
    monkeypatch.setattr(causes_module, "MAX_ATTRIBUTED_ELEMENTS", 10)
    hypotheses = _CountingHypotheses()
    rows = annotate_causes(
        [_row("h_post", "fail")],
        case,
        fixture,
        oracle_leaves={"h_post": np.zeros((2, 64, 4))},
        oracle_sensitivity={},
        candidate_leaves={"kernel/unsharded": {"h_post": np.ones((2, 64, 4))}},
        hypotheses=hypotheses,
    )
    assert hypotheses.calls == 0 and rows[0]["cause_id"] == "not_attributed"
    assert rows[0]["cause"].startswith("not attributed: the case's") and "more than the hypotheses" in rows[0]["cause"]


# ── one broken leaf, end to end ───────────────────────────────────────────────────────

# One sharded case: the break fails d_post_bias on its two interpret paths (unsharded and
# sharded), four rows of two candidates that must make one cause heading. A bfloat16 case
# (lite-n4-c128-b2s64-bf16-w32-mlp-mixed_signs) ran beside it once; its sensitivity is wider
# than the 1% break, so every row of it passed: it added no failing row, cause search or
# heading to what is checked, and cost a clean and a broken pass of its own.
BROKEN_CASES = ("lite-n4-c128-b2s256-f32-w32-identity-default-m2x4-bt64",)


def _post_bias_grad_scaled(original_bwd):
    """The kernels' custom VJP with the post_bias gradient 1% too large: a logic error."""

    def pre_core_bwd_scaling_post_bias(config, kernel, residuals, cotangents):
        d_x2, d_weights = original_bwd(config, kernel, residuals, cotangents)
        grads = d_weights.as_dict()
        grads["post_bias"] = grads["post_bias"] * 1.01
        return d_x2, type(d_weights).from_dict(grads)

    return pre_core_bwd_scaling_post_bias


@pytest.mark.slow
def test_a_broken_leaf_is_one_cause_heading_first_in_the_html_and_the_gate():
    break_ = Perturbation(
        name="kernel.post_bias_grad_scaled",
        description="d_post_bias x 1.01",
        patches=(Patch(Seam("mhc_parity.mhc.kernels.api", "_pre_core.bwd"), _post_bias_grad_scaled),),
        implementations=("interpret",),
    )
    # The kill matrix's passes (`mhc_parity.harness.faults.passes`): the broken run traces the
    # interpret paths afresh under the patch and takes the reference paths' outputs, and their rows,
    # from the clean run (traced unpatched: the patch is in the kernels alone), sharing its fixtures,
    # oracle answers and hypotheses. Its rows are those of two separate runs but for timing.
    impls = tuple(BUILTIN[n] for n in ("reference", "interpret"))
    cases = [registry.get(name) for name in BROKEN_CASES]
    policy, shared, memo = load_policy(), passes.SharedInputs(), {}
    clean = passes.run_clean_pass(cases, policy, shared, memo, impls)
    broken = passes.perturbed_rows_of(break_, cases, policy, shared, memo, impls, clean)
    failing = [r for r in broken if r["verdict"] == "fail"]
    assert failing and {r["leaf"] for r in failing} == {"d_post_bias"}
    (group,) = cause_groups(broken)
    assert group.candidates == ["interpret/*"] and group.cause_id == UNEXPLAINED_ID and len(group.rows) == len(failing)
    page = render_html(to_frame(broken, source="broken run"))
    first_screen = page[page.index('id="implementations"') : page.index("<nav>")]
    assert "<code>d_post_bias</code> of <code>interpret/*</code>" in first_screen
    assert first_screen.count("<details>") == 1
    table = gate(clean, broken).table()
    assert table.count(UNEXPLAINED) == 1 and f"failure ({len(failing)} rows, from 1 cause)" in table
