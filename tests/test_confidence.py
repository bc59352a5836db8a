"""Bounds with a stated false-positive rate: mhc_parity.harness.judging.confidence, the draws' statistics
(error_statistics.effective_dof / statistic_dof / gain) and the policy's [confidence]."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mhc_parity.harness.judging.confidence import Sensitivity, quantile
from mhc_parity.harness.judging.error_statistics import effective_dof, gain, statistic_dof
from mhc_parity.harness.judging.metrics import leaf_metrics
from mhc_parity.harness.judging.policy import PolicyError
from mhc_parity.harness.judging.policy_file import load_policy, parse_policy

F32_EPS = 2.0**-23

CONFIDENCE = """
[confidence]
false_positive_rate = 1e-5
gain_leaf_kinds = ["intermediate"]
rationale = "test"
"""
ORACLE_RULE = """
[[rule]]
comparison = "vs_oracle"
dtype = "*"
leaf_kind = "*"
kind = "oracle_ratio"
ratio = 2
floor_ulps = 4
direct_ulps = 0
rationale = "test"
"""


def _policy(confidence: str = CONFIDENCE):
    return parse_policy("version = 2\n" + confidence + ORACLE_RULE)


def _judge(policy, m, leaf_kind="intermediate"):
    return policy.judge(m, comparison="vs_oracle", leaf_kind=leaf_kind, dtype="float32", act_dtype="float32")


# ── the quantile ──────────────────────────────────────────────────────────────────────


def test_one_direction_quantile_is_students_t():
    # ‖e‖²/S² ~ F(1, N): |e|/S is a Student t with N degrees of freedom, two-sided.
    for draws in (4, 16, 32):
        assert quantile(1e-5, 1.0, draws) == pytest.approx(stats.t.ppf(1 - 0.5e-5, draws), rel=1e-9)


def test_quantile_falls_with_degrees_of_freedom_and_draws_towards_one():
    by_dof = [quantile(1e-5, k, 16) for k in (1, 2, 8, 64, 4096)]
    assert by_dof == sorted(by_dof, reverse=True) and 1.0 < by_dof[-1] < 1.06
    by_draws = [quantile(1e-5, 1.0, n) for n in (4, 8, 16, 64)]
    assert by_draws == sorted(by_draws, reverse=True)
    assert quantile(1e-3, 1.0, 16) < quantile(1e-5, 1.0, 16)


def test_quantile_without_a_measured_sensitivity_is_one_and_bad_rates_are_refused():
    assert quantile(1e-5, math.nan, 16) == 1.0 and quantile(1e-5, 4.0, math.nan) == 1.0
    for rate in (0.0, 1.0, -1e-5):
        with pytest.raises(ValueError, match="false-positive rate"):
            quantile(rate, 1.0, 16)


@pytest.mark.parametrize("directions", [1, 3, 40])
def test_the_stated_rate_holds_for_gaussian_errors(directions):
    """Simulated: a correct implementation's error is one more draw of the model; the bound
    q * S fails it with the stated probability, whatever the leaf's degrees of freedom."""
    rng = np.random.default_rng(directions)
    rate, draws, trials, size = 0.01, 16, 6000, 64
    basis = rng.normal(size=(directions, size))
    weights = np.linspace(1.0, 2.0, directions)  # unequal directions: Satterthwaite's k

    def sample(count):
        return (rng.normal(size=(count, directions)) * weights) @ basis

    failures = 0
    for _ in range(trials):
        model = sample(draws)
        k = effective_dof(list(model))
        s = math.sqrt(np.mean(np.sum(model**2, axis=1)))
        failures += math.sqrt(np.sum(sample(1) ** 2)) > quantile(rate, k, draws) * s
    # 6000 trials at 1%: 60 expected; the estimate of k is itself noisy for many directions.
    assert 25 <= failures <= 110, failures


# ── the draws' statistics ─────────────────────────────────────────────────────────────


def test_effective_dof_counts_independent_error_directions():
    rng = np.random.default_rng(0)
    direction = rng.normal(size=500)
    assert effective_dof([rng.normal() * direction for _ in range(16)]) == pytest.approx(1.0)
    assert effective_dof([rng.normal(size=500) for _ in range(16)]) == pytest.approx(500, rel=0.25)
    assert effective_dof([rng.normal(size=3) for _ in range(16)]) <= 3
    assert effective_dof([np.zeros(10)] * 4) == 1.0
    with pytest.raises(ValueError, match="at least 2 draws"):
        effective_dof([direction])


def test_statistic_dof_matches_a_chi_square_spread():
    rng = np.random.default_rng(1)
    values = np.sqrt(rng.chisquare(20, size=4000) / 20)
    assert statistic_dof(values, ceiling=1e6) == pytest.approx(20, rel=0.15)
    assert statistic_dof([0.3] * 16, ceiling=7.0) == 7.0
    assert statistic_dof(np.sqrt(rng.chisquare(20, size=16)), ceiling=2.0) <= 2.0


def test_gain_is_the_scale_error_and_ignores_orthogonal_noise():
    rng = np.random.default_rng(2)
    value = rng.normal(size=4096)
    assert gain(value * 1.1, value) == pytest.approx(0.1, rel=1e-12)
    noise = rng.normal(size=4096) * 0.05
    assert abs(gain(value + noise, value)) < 0.005
    assert gain(np.zeros(3), np.zeros(3)) == 0.0 and gain(np.ones(3), np.zeros(3)) == math.inf
    assert math.isnan(gain(np.array([np.nan, 1.0]), np.ones(2)))


def test_sensitivity_round_trips_and_refuses_other_fields():
    s = Sensitivity(max=1e-3, rms=5e-4, gain=1e-5, dof_max=12.0, dof_rms=300.0, draws=16)
    assert Sensitivity.from_dict(s.as_dict()) == s
    with pytest.raises(ValueError, match="a sensitivity holds"):
        Sensitivity.from_dict({"max": 1.0, "rms": 1.0})


# ── the policy's [confidence] and the bound ───────────────────────────────────────────


def test_confidence_scales_the_sensitivity_by_its_quantile():
    policy = _policy()
    rng = np.random.default_rng(4)
    oracle = rng.uniform(0.5, 1.0, size=256)
    sensitivity = Sensitivity(max=1e-4, rms=1e-4, gain=1e-6, dof_max=1.0, dof_rms=1.0, draws=16)
    q = quantile(1e-5, 1.0, 16)
    limit = 2 * q * 1e-4 + 4 * F32_EPS
    inside = oracle + oracle.max() * limit * 0.999 * np.eye(1, 256, 7)[0]  # one element: max and rms
    m = leaf_metrics(inside, oracle, oracle, dtype="float32", sensitivity=sensitivity)
    judged = _judge(policy, m, leaf_kind="weight_grad")
    assert judged.verdict == "pass" and judged.bound_usage == pytest.approx(0.999, rel=1e-6)
    without = parse_policy("version = 2\n" + ORACLE_RULE)
    assert _judge(without, m, leaf_kind="weight_grad").verdict == "fail"
    assert "at p=1e-05" in judged.bound and "+gain" not in judged.bound


def test_the_gain_criterion_fails_a_scaled_leaf_the_rms_error_lets_through():
    policy = _policy()
    rng = np.random.default_rng(5)
    oracle = rng.normal(size=2048)
    scaled = oracle * 1.01
    # A model that explains a 2% RMS error from rounding, but hardly any scale error.
    sensitivity = Sensitivity(max=0.05, rms=0.02, gain=0.02 / math.sqrt(2048), dof_max=50, dof_rms=2048, draws=16)
    m = leaf_metrics(scaled, oracle, oracle, dtype="float32", sensitivity=sensitivity)
    failed = _judge(policy, m, leaf_kind="intermediate")
    assert failed.verdict == "fail" and "cand_oracle_gain=0.01 >" in failed.reason
    assert "+gain" in failed.bound
    # Off the gain leaf kinds only the max and RMS errors are held.
    assert _judge(policy, m, leaf_kind="weight_grad").verdict == "pass"
    noisy = oracle + rng.normal(size=2048) * 0.01
    passed = _judge(policy, leaf_metrics(noisy, oracle, oracle, dtype="float32", sensitivity=sensitivity))
    assert passed.verdict == "pass"


@pytest.mark.parametrize(
    "table, field",
    [
        (CONFIDENCE.replace("1e-5", "0.7"), "false_positive_rate"),
        (CONFIDENCE.replace("1e-5", "true"), "false_positive_rate"),
        (CONFIDENCE.replace('["intermediate"]', '["hidden"]'), "gain_leaf_kinds"),
        (CONFIDENCE.replace('rationale = "test"', 'rationale = " "'), "rationale"),
        (CONFIDENCE + "fudge = 2\n", "unknown keys"),
    ],
)
def test_confidence_table_is_validated(table, field):
    with pytest.raises(PolicyError, match=field):
        _policy(table)


def test_the_packaged_policy_states_its_rate():
    policy = load_policy()
    assert policy.confidence is not None and policy.confidence.false_positive_rate <= 1e-4
    assert {"intermediate", "output"} <= set(policy.confidence.gain_leaf_kinds)
