"""The dtype a path holds a leaf in, as evidence of a narrow sum (`mhc_parity.harness.judging.held_precision`).

Where two paths each lie within their rounding model but differ by more than their comparison
allows, both holding the leaf in bfloat16 (which the model does not allow) names the one
order-dependent hypothesis that holds it there. Pinned here: what "held" means, the chance of a
correct float32 value being held by accident, the rule on made-up draws, and on real paths: MaxText
0.2.5's released reference named, and no pair of correct paths named on any leaf.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from mhc_parity.harness.engine.cause_store import CauseStore
from mhc_parity.harness.engine.comparison_store import ComparisonStore
from mhc_parity.harness.judging.held_precision import HeldDraw, held_in, ordered_sum_holding

BF16_VALUES = np.array([0.5, -1.25, 3.0, 0.0], dtype=np.float32)  # every one a bfloat16 number
RESIDUAL_SUMS = "round:gate_weight/residual_gate:forward:bfloat16:backend_sums"


def _bf16(values) -> np.ndarray:
    return np.asarray(values, np.float64).astype(ml_dtypes.bfloat16).astype(np.float64)


def test_held_means_every_non_zero_value_is_a_number_of_the_dtype():
    assert held_in(BF16_VALUES, "bfloat16")
    assert not held_in(BF16_VALUES + np.float32(2.0**-20), "bfloat16")
    assert not held_in(np.zeros(4, np.float32), "bfloat16"), "zeros are numbers of every dtype: no evidence"
    assert not held_in(np.array([1.0, np.inf], np.float32), "bfloat16")
    assert held_in(BF16_VALUES, "float16") and not held_in(np.float32([1e6]), "float16")  # beyond float16's range


def test_a_correct_float32_value_is_a_bfloat16_number_about_once_in_2_to_the_16():
    values = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
    exact = np.count_nonzero(values.astype(ml_dtypes.bfloat16).astype(np.float32) == values)
    # 2**22 draws at 2**-16 each: 64 expected; a Poisson count outside [20, 130] has chance < 1e-9.
    assert 20 <= exact <= 130, exact
    assert not held_in(values, "bfloat16") and held_in(values[values.astype(ml_dtypes.bfloat16) == values], "bfloat16")


def _draws(leaf_values: dict[str, dict[str, np.ndarray]], ordered: set[str]) -> list[HeldDraw]:
    return [HeldDraw(name, name in ordered, leaves) for name, leaves in leaf_values.items()]


EXACT = {"a": np.array([0.1, 0.2, 0.3]), "b": np.array([0.7, 0.9])}


def _path(a_held: bool = True, b_held: bool = True) -> dict[str, np.ndarray]:
    """A float32 path's leaves, each held in bfloat16 or off it by a float32 ulp or more."""

    def leaf(name, held):
        v = _bf16(EXACT[name] * 1.001) if held else EXACT[name] * 1.001
        return v.astype(np.float32)

    return {"a": leaf("a", a_held), "b": leaf("b", b_held)}


def test_the_one_ordered_hypothesis_holding_the_leaf_where_both_paths_hold_it_is_named():
    held = {leaf: _bf16(v * 1.002) for leaf, v in EXACT.items()}
    draws = _draws(
        {
            "sum:a": {"a": held["a"], "b": EXACT["b"]},
            "round:a": {"a": held["a"], "b": EXACT["b"]},
            "sum:unrelated": {"a": EXACT["a"] * 1.01, "b": EXACT["b"]},
        },
        ordered={"sum:a", "sum:unrelated"},
    )
    assert ordered_sum_holding("a", [_path(), _path()], EXACT, draws) == ("sum:a", "bfloat16")
    # One path holds it in float32: no evidence.
    assert ordered_sum_holding("a", [_path(), _path(a_held=False)], EXACT, draws) is None
    # The model allows the leaf held in bfloat16 (no unordered hypothesis holds it there).
    allowed = [d for d in draws if d.name != "round:a"]
    assert ordered_sum_holding("a", [_path(), _path()], EXACT, allowed) is None
    # A leaf stored in bfloat16 is held there by construction.
    stored = {leaf: v.astype(ml_dtypes.bfloat16) for leaf, v in _path().items()}
    assert ordered_sum_holding("a", [stored, stored], EXACT, draws) is None


def test_a_hypothesis_holding_a_leaf_the_paths_do_not_hold_is_not_named_and_a_tie_names_none():
    held = {leaf: _bf16(v * 1.002) for leaf, v in EXACT.items()}
    rounded = {"round:a": {"a": held["a"], "b": EXACT["b"]}}
    both = _draws({**rounded, "sum:ab": dict(held)}, ordered={"sum:ab"})
    # The paths hold `b` in float32: a hypothesis that would hold it in bfloat16 is not theirs.
    assert ordered_sum_holding("a", [_path(b_held=False)] * 2, EXACT, both) is None
    assert ordered_sum_holding("a", [_path()] * 2, EXACT, both) == ("sum:ab", "bfloat16")
    # The one holding more of the paths' held leaves wins; two holding as many name none.
    more = _draws({**rounded, "sum:a": {"a": held["a"], "b": EXACT["b"]}, "sum:ab": dict(held)}, {"sum:a", "sum:ab"})
    assert ordered_sum_holding("a", [_path()] * 2, EXACT, more) == ("sum:ab", "bfloat16")
    tie = _draws({**rounded, "sum:a1": {"a": held["a"]}, "sum:a2": {"a": held["a"]}}, {"sum:a1", "sum:a2"})
    assert ordered_sum_holding("a", [_path()] * 2, EXACT, tie) is None


# ── on real paths: MaxText 0.2.5's case whose sharded d_res_bias row no value match names ──

MAXTEXT_CASE = "lite-n4-c128-b2s256-bf16-w32-identity-bf16_inexact_gates-m2x4-bt64-btb32"


@pytest.fixture(scope="module")
def maxtext_leaves():
    """Every path's leaves on `MAXTEXT_CASE`, the exact oracle's and the hypotheses' draws, as the
    runner hands them to `annotate_causes` (this project's reference, MaxText's released and fixed
    reference paths, unsharded and sharded)."""
    pytest.importorskip("maxtext")
    import mhc_parity.harness.engine.case_judging as case_judging
    from mhc_parity.harness.api import run_parity

    seen = {}
    original = case_judging.annotate_causes

    def capturing(rows, case, fixture, **inputs):
        chosen, leaves = inputs["hypotheses"](case, fixture)
        seen.update(inputs, draws=[HeldDraw(h.name, h.ordered, d) for h, d in zip(chosen, leaves)])
        return original(rows, case, fixture, **inputs)

    def computed(self, rows, case, fixture, oracle, candidate_leaves, candidate_sensitivity, compute):
        return compute()  # never a stored answer: the capture must see the inputs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(case_judging, "annotate_causes", capturing)
        patch.setattr(CauseStore, "causes", computed)
        # Nor judged rows stored by an earlier run of this case: those skip the causes altogether.
        patch.setattr(ComparisonStore, "load", lambda self, material, timings: None)
        run = run_parity(
            "mhc_parity.maxtext_parity:implementations",
            suite="maxtext",
            cases=[MAXTEXT_CASE],
            paths=["reference/*", "maxtext-layer-reference/*", "maxtext-layer-reference-fixed/*"],
        )
    assert len(run.rows), "the case ran"
    return seen


@pytest.mark.slow
def test_the_released_references_shardings_are_named_by_the_residual_gate_held_in_bfloat16(maxtext_leaves):
    paths = maxtext_leaves["candidate_leaves"]
    pair = [paths["maxtext-layer-reference/unsharded"], paths["maxtext-layer-reference/sharded(data=2,fsdp=4)"]]
    found = ordered_sum_holding("d_res_bias", pair, maxtext_leaves["oracle_leaves"], maxtext_leaves["draws"])
    assert found == (RESIDUAL_SUMS, "bfloat16")


@pytest.mark.slow
def test_no_pair_of_correct_paths_is_named_on_any_leaf(maxtext_leaves):
    paths = maxtext_leaves["candidate_leaves"]
    correct = [name for name in paths if name.startswith(("reference/", "maxtext-layer-reference-fixed/"))]
    assert len(correct) == 4, sorted(paths)
    named = [
        (a, b, leaf)
        for a, b in itertools.combinations(correct, 2)
        for leaf in paths[a]
        if ordered_sum_holding(leaf, [paths[a], paths[b]], maxtext_leaves["oracle_leaves"], maxtext_leaves["draws"])
    ]
    assert named == []
