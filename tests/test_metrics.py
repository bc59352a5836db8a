"""mhc_parity.harness.judging.metrics on hand-made arrays: every metric, NaN/Inf/zeros, bfloat16 ULP edges."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import subprocess
import sys
import weakref

import ml_dtypes
import numpy as np
import pytest

from mhc_parity.harness.judging.metrics import (
    DTYPE_FORMATS,
    LeafMetrics,
    MetricsMemo,
    dtype_name,
    eps,
    leaf_metrics,
    ulp_spacing,
)
from mhc_parity.records import schema
from mhc_parity.records.project_code import PROJECT_ROOT

BF16 = ml_dtypes.bfloat16
F32_EPS = 2.0**-23
BF16_EPS = 2.0**-7


def bf16(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(BF16)


# ── dtype plumbing ────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", sorted(DTYPE_FORMATS))
def test_formats_agree_with_finfo(name):
    info = ml_dtypes.finfo(BF16) if name == "bfloat16" else np.finfo(np.dtype(name))
    mantissa_bits, min_exponent = DTYPE_FORMATS[name]
    assert eps(name) == float(info.eps) == 2.0**-mantissa_bits
    assert 2.0**min_exponent == float(info.smallest_normal)
    assert 2.0 ** (min_exponent - mantissa_bits) == float(info.smallest_subnormal)


def test_dtype_name_accepts_names_types_and_dtypes():
    assert dtype_name("bfloat16") == dtype_name(BF16) == dtype_name(np.dtype(BF16)) == "bfloat16"
    assert dtype_name(np.float32) == dtype_name("float32") == "float32"
    assert eps(BF16) == 0.0078125 and eps("float32") == F32_EPS
    with pytest.raises(ValueError, match="int32"):
        dtype_name(np.int32)
    with pytest.raises(ValueError, match="float8"):
        ulp_spacing([1.0], "float8")


# ── ulp_spacing ───────────────────────────────────────────────────────────────────────


def test_ulp_spacing_bfloat16_binades():
    v = bf16([1.0, 1.9921875, 2.0, 3.0, 0.5, -1.0, -2.0, 256.0])
    expected = [2**-7, 2**-7, 2**-6, 2**-6, 2**-8, 2**-7, 2**-6, 2.0]
    np.testing.assert_array_equal(ulp_spacing(v, "bfloat16"), expected)


def test_ulp_spacing_is_distance_to_next_away_from_zero_bfloat16():
    rng = np.random.default_rng(0)
    mags = np.exp2(rng.uniform(-120, 120, size=2000))
    v = (mags * rng.choice([-1.0, 1.0], size=mags.size)).astype(BF16)
    away = np.nextafter(v, np.where(v > 0, np.inf, -np.inf).astype(BF16))
    np.testing.assert_array_equal(ulp_spacing(v, "bfloat16"), np.abs(away.astype(np.float64) - v.astype(np.float64)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_ulp_spacing_matches_np_spacing(dtype):
    info = np.finfo(dtype)
    v = np.array([1.0, 2.0, 3.0, 0.1, 1e-3, float(info.max) / 2, float(info.smallest_normal), 7.5], dtype=dtype)
    np.testing.assert_array_equal(ulp_spacing(v, dtype), np.spacing(v).astype(np.float64))
    np.testing.assert_array_equal(ulp_spacing(-v, dtype), np.spacing(v).astype(np.float64))
    # at the largest finite value np.spacing says inf (the next value overflows); the
    # binade formula keeps the top binade's spacing, so an error there stays finite
    assert ulp_spacing([info.max], dtype)[0] == float(info.max) - float(np.nextafter(info.max, dtype(0)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_ulp_spacing_matches_np_spacing_in_every_binade(dtype):
    """Every exponent of the dtype, subnormals included, below its top binade (see above)."""
    info = np.finfo(dtype)
    powers = np.ldexp(1.0, np.arange(info.minexp - info.nmant, info.maxexp - 1)).astype(dtype)
    v = np.concatenate([powers, powers * dtype(1.5), -powers])
    np.testing.assert_array_equal(ulp_spacing(v, dtype), np.spacing(np.abs(v)).astype(np.float64))


def test_ulp_spacing_zero_and_subnormals_use_smallest_subnormal():
    assert ulp_spacing([0.0], "bfloat16")[0] == 2.0**-133
    assert ulp_spacing([0.0, -0.0, 1e-44, 2.0**-127], "float32").tolist() == [2.0**-149] * 4
    assert ulp_spacing([0.0], "float64")[0] == 5e-324
    # just above the smallest normal: the normal spacing, which equals the subnormal one
    assert ulp_spacing([2.0**-126], "float32")[0] == 2.0**-149


def test_ulp_spacing_nonfinite_is_nan_and_shape_kept():
    out = ulp_spacing(np.array([[np.inf, -np.inf], [np.nan, 1.0]], dtype=np.float32), "float32")
    assert out.shape == (2, 2) and out.dtype == np.float64
    assert np.isnan(out[0]).all() and np.isnan(out[1, 0]) and out[1, 1] == F32_EPS


def test_ulp_spacing_of_unrepresentable_float64_uses_its_binade():
    # oracle values are float64: measured in the dtype's binade they fall in
    assert ulp_spacing([1.0 + 1e-12], "bfloat16")[0] == 2**-7
    assert ulp_spacing([2.0 - 1e-12], "bfloat16")[0] == 2**-7
    assert ulp_spacing([1e39], "float32")[0] == 2.0 ** (129 - 23)  # beyond max: binade formula


# ── leaf_metrics: basic values ───────────────────────────────────────────────────────


def test_identical_leaves():
    a = np.array([[1.0, -2.0], [3.0, 0.0]], dtype=np.float32)
    m = leaf_metrics(a, a.copy(), a.astype(np.float64), dtype="float32")
    assert (m.max_abs_err, m.max_rel_err, m.rel_rms_err, m.max_ulp, m.p99_ulp) == (0, 0, 0, 0, 0)
    assert m.cosine == 1.0
    assert (m.cand_oracle_max_err, m.partner_oracle_max_err, m.oracle_ratio_max) == (0.0, 0.0, 1.0)
    assert (m.cand_oracle_rms_err, m.partner_oracle_rms_err, m.oracle_ratio_rms) == (0.0, 0.0, 1.0)


def test_hand_computed_errors():
    c = np.array([1.0, 2.0, 3.0, 4.0])
    p = np.array([1.0, 2.0, 3.0, 5.0])
    m = leaf_metrics(c, p, dtype="float64")
    assert m.max_abs_err == 1.0
    assert m.max_rel_err == 1.0 / 5.0
    assert m.rel_rms_err == pytest.approx(1.0 / math.sqrt(39.0), rel=1e-15)
    assert m.cosine == pytest.approx(np.dot(c, p) / (np.linalg.norm(c) * np.linalg.norm(p)), rel=1e-15)
    assert m.max_ulp == 1.0 / 2.0**-50  # ulp of 5.0 in float64 is 2^(2-52)


def test_relative_errors_normalise_by_max_not_elementwise():
    # a near-zero partner element must not dominate: 1e-3 abs error on a 1e-6 element
    p = np.array([1e-6, 1.0])
    c = np.array([1e-6 + 1e-3, 1.0])
    m = leaf_metrics(c, p, dtype="float64")
    assert m.max_rel_err == pytest.approx(1e-3, rel=1e-9)


def test_bfloat16_one_and_its_neighbour_differ_by_one_ulp():
    m = leaf_metrics(bf16([1.0078125]), bf16([1.0]), dtype=BF16)
    assert m.max_ulp == 1.0 and m.p99_ulp == 1.0
    assert m.max_abs_err == BF16_EPS and m.max_rel_err == BF16_EPS


def test_bfloat16_ulps_across_a_power_of_two():
    below_two = 2.0 - 2.0**-7  # largest bfloat16 below 2
    # partner 2.0: spacing there is 2^-6, so the neighbour below is half an ulp away
    assert leaf_metrics(bf16([below_two]), bf16([2.0]), dtype="bfloat16").max_ulp == 0.5
    # partner just below 2: its spacing is 2^-7, so 2.0 is one ulp away
    assert leaf_metrics(bf16([2.0]), bf16([below_two]), dtype="bfloat16").max_ulp == 1.0
    # two steps up across the boundary: 2^-7 + 2^-6 = 3 ulps of the partner's binade
    assert leaf_metrics(bf16([2.0 + 2.0**-6]), bf16([below_two]), dtype="bfloat16").max_ulp == 3.0


def test_ulps_use_the_given_dtype_not_the_input_dtype():
    c = np.array([1.0 + F32_EPS], dtype=np.float32)
    p = np.array([1.0], dtype=np.float32)
    assert leaf_metrics(c, p, dtype="float32").max_ulp == 1.0
    assert leaf_metrics(c, p, dtype="bfloat16").max_ulp == 2.0**-16


def test_p99_ulp_is_an_observed_high_percentile():
    p = np.ones(200, dtype=np.float32)
    c = p.copy()
    c[0] = np.float32(1.0 + 50 * F32_EPS)
    m = leaf_metrics(c, p, dtype="float32")
    assert m.max_ulp == 50.0 and m.p99_ulp == 0.0  # 1 of 200 is above the 99th percentile
    c[1] = np.float32(1.0 + 7 * F32_EPS)
    m = leaf_metrics(c, p, dtype="float32")
    assert m.max_ulp == 50.0 and m.p99_ulp == 7.0  # 2 of 200: the 99th percentile is hit


def test_cosine_edges():
    v = np.array([1.0, -2.0, 3.0], dtype=np.float32)
    assert leaf_metrics(-v, v, dtype="float32").cosine == -1.0
    assert leaf_metrics(3 * v, v, dtype="float32").cosine == pytest.approx(1.0, abs=1e-15)
    assert leaf_metrics(np.array([1.0, 0.0]), np.array([0.0, 1.0]), dtype="float64").cosine == 0.0
    z = np.zeros(3, dtype=np.float32)
    assert leaf_metrics(z, z, dtype="float32").cosine == 1.0
    assert leaf_metrics(v, z, dtype="float32").cosine == 0.0
    assert leaf_metrics(z, v, dtype="float32").cosine == 0.0


def test_huge_float32_values_do_not_overflow_the_norms():
    big = np.float32(3e38)
    p = np.array([big, big], dtype=np.float32)
    c = np.array([big, np.nextafter(big, np.float32(np.inf))], dtype=np.float32)
    m = leaf_metrics(c, p, dtype="float32")
    assert math.isfinite(m.rel_rms_err) and m.rel_rms_err > 0
    assert m.cosine == pytest.approx(1.0)
    assert m.max_ulp == 1.0


# ── zeros ─────────────────────────────────────────────────────────────────────────────


def test_both_zero():
    z = np.zeros((2, 3), dtype=BF16)
    m = leaf_metrics(z, z, np.zeros((2, 3)), dtype=BF16)
    assert (m.max_abs_err, m.max_rel_err, m.rel_rms_err, m.max_ulp, m.cosine) == (0, 0, 0, 0, 1)
    assert (m.oracle_ratio_max, m.oracle_ratio_rms) == (1.0, 1.0)


def test_partner_zero_candidate_not():
    m = leaf_metrics(np.array([0.0, 1e-30], np.float32), np.zeros(2, np.float32), dtype="float32")
    assert m.max_abs_err == pytest.approx(1e-30)
    assert m.max_rel_err == math.inf and m.rel_rms_err == math.inf
    assert m.max_ulp == pytest.approx(float(np.float32(1e-30)) / 2.0**-149)  # subnormal spacing
    assert m.cosine == 0.0


def test_empty_leaves_compare_as_identical():
    e = np.zeros((0, 4), dtype=np.float32)
    m = leaf_metrics(e, e, e.astype(np.float64), dtype="float32")
    assert (m.max_abs_err, m.max_rel_err, m.rel_rms_err, m.max_ulp, m.p99_ulp, m.cosine) == (0, 0, 0, 0, 0, 1)


# ── NaN and Inf: never hidden ────────────────────────────────────────────────────────


def _all_error_metrics(m: LeafMetrics):
    return [m.max_abs_err, m.max_rel_err, m.rel_rms_err, m.max_ulp, m.p99_ulp]


def test_nan_in_candidate_poisons_every_error_metric():
    p = np.ones(1000, dtype=np.float32)
    c = p.copy()
    c[17] = np.nan
    m = leaf_metrics(c, p, p.astype(np.float64), dtype="float32")
    assert all(math.isnan(x) for x in _all_error_metrics(m))
    assert math.isnan(m.cosine)
    assert math.isnan(m.cand_oracle_max_err) and math.isnan(m.cand_oracle_rms_err)
    assert math.isnan(m.oracle_ratio_max) and math.isnan(m.oracle_ratio_rms)
    assert m.partner_oracle_max_err == 0.0  # the partner is fine
    assert (m.nan_count, m.inf_count, m.partner_nan_count, m.oracle_nan_count) == (1, 0, 0, 0)


def test_nan_in_partner_poisons_and_is_counted():
    c = bf16([1.0, 2.0, 3.0])
    p = bf16([1.0, np.nan, 3.0])
    m = leaf_metrics(c, p, dtype="bfloat16")
    assert all(math.isnan(x) for x in _all_error_metrics(m))
    assert (m.nan_count, m.partner_nan_count) == (0, 1)


def test_inf_in_candidate_gives_inf_errors():
    c = np.array([1.0, np.inf, -np.inf], dtype=np.float32)
    p = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    m = leaf_metrics(c, p, p.astype(np.float64), dtype="float32")
    assert m.max_abs_err == m.max_rel_err == m.rel_rms_err == m.max_ulp == math.inf
    assert math.isnan(m.cosine)
    assert m.cand_oracle_max_err == math.inf and m.oracle_ratio_max == math.inf
    assert (m.nan_count, m.inf_count, m.partner_inf_count) == (0, 2, 0)


def test_matching_infs_do_not_compare_equal():
    # inf - inf is NaN: a shared Inf is still reported, never a zero error
    c = np.array([np.inf, 1.0], dtype=np.float32)
    m = leaf_metrics(c, c.copy(), dtype="float32")
    assert all(math.isnan(x) for x in _all_error_metrics(m))
    assert (m.inf_count, m.partner_inf_count) == (1, 1)


def test_oracle_counts_and_missing_oracle():
    c = np.array([1.0, 2.0], dtype=np.float32)
    m = leaf_metrics(c, c, np.array([np.nan, np.inf]), dtype="float32")
    assert (m.oracle_nan_count, m.oracle_inf_count) == (1, 1)
    assert math.isnan(m.cand_oracle_max_err)
    m = leaf_metrics(c, c, dtype="float32")
    assert (m.oracle_nan_count, m.oracle_inf_count) == (0, 0)
    for f in (
        "cand_oracle_max_err",
        "partner_oracle_max_err",
        "oracle_ratio_max",
        "cand_oracle_rms_err",
        "partner_oracle_rms_err",
        "oracle_ratio_rms",
    ):
        assert math.isnan(getattr(m, f)), f


# ── oracle errors and ratios ─────────────────────────────────────────────────────────


def test_oracle_errors_and_ratio():
    o = np.array([1.0, -2.0, 4.0])
    p = np.array([1.0, -2.0, 4.5])
    c = np.array([1.25, -2.0, 4.0])
    m = leaf_metrics(c, p, o, dtype="float64")
    assert m.cand_oracle_max_err == 0.25 / 4.0
    assert m.partner_oracle_max_err == 0.5 / 4.0
    assert m.oracle_ratio_max == 0.5
    assert m.cand_oracle_rms_err == pytest.approx(0.25 / math.sqrt(21.0), rel=1e-15)
    assert m.partner_oracle_rms_err == pytest.approx(0.5 / math.sqrt(21.0), rel=1e-15)
    assert m.oracle_ratio_rms == pytest.approx(0.5, rel=1e-15)


def test_oracle_ratio_edges():
    o = np.array([1.0, 2.0])
    exact = o.copy()
    off = np.array([1.0, 2.5])
    assert leaf_metrics(exact, exact, o, dtype="float64").oracle_ratio_max == 1.0  # 0/0
    assert leaf_metrics(off, exact, o, dtype="float64").oracle_ratio_max == math.inf  # x/0
    assert leaf_metrics(exact, off, o, dtype="float64").oracle_ratio_max == 0.0
    m = leaf_metrics(exact, off, np.zeros(2), dtype="float64")  # zero oracle, nonzero values
    assert m.cand_oracle_max_err == math.inf and math.isnan(m.oracle_ratio_max)  # inf/inf


# ── shapes, types, row fields ────────────────────────────────────────────────────────


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        leaf_metrics(np.zeros((2, 3)), np.zeros((3, 2)), dtype="float32")
    with pytest.raises(ValueError, match=r"oracle shape \(6,\)"):
        leaf_metrics(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(6), dtype="float32")
    with pytest.raises(ValueError):  # no broadcasting either
        leaf_metrics(np.zeros((2, 3)), np.zeros((1, 3)), dtype="float32")


def test_row_fields_are_exactly_the_schema_metric_columns():
    m = leaf_metrics(np.ones(3, np.float32), np.ones(3, np.float32), np.ones(3), dtype="float32")
    fields = m.as_row_fields()
    # Judging's columns (bound, quantiles, cause), timings, a compile row's program figures and the oracle's memory.
    not_metrics = {"bound_usage", "allowed_error", *schema.TIMING_COLUMNS, "cause_explained"}
    not_metrics |= {"oracle_quantile_max", "oracle_quantile_rms"}
    not_metrics |= {"vmem_asked_bytes", "vmem_allowed_bytes"}
    not_metrics |= {"code_bytes", "argument_bytes", "output_bytes", "temp_bytes"}
    not_metrics |= {"oracle_peak_bytes", "oracle_budget_bytes"}  # the case's oracle's memory, not a leaf's
    metric_columns = set(schema.FLOAT_COLUMNS + schema.INT_COLUMNS) - not_metrics
    assert set(fields) == metric_columns
    assert [f.name for f in dataclasses.fields(LeafMetrics)] == [c for c in schema.ROW_COLUMNS if c in fields]
    for k in schema.INT_COLUMNS:
        assert type(fields[k]) is int
    for k in metric_columns - set(schema.INT_COLUMNS):
        assert type(fields[k]) is float
    schema.empty_row(**fields)  # accepted by the schema
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.max_abs_err = 1.0  # type: ignore[misc]


# ── systematic error ─────────────────────────────────────────────────────────────────


def test_systematic_error_separates_a_shared_shift_from_per_token_noise():
    from mhc_parity.harness.judging.metrics import systematic_error

    rng = np.random.default_rng(0)
    expected = rng.normal(size=(4, 128, 3))
    noisy = expected + 1e-3 * rng.normal(size=expected.shape)
    t, shift = systematic_error(noisy, expected)
    assert t < 5 and shift < 1e-3
    shifted = noisy.copy()
    shifted[..., 1] += 5e-4  # half the noise, shared by every token of stream 1
    t, shift = systematic_error(shifted, expected)
    assert t > 8 and shift == pytest.approx(5e-4 / np.max(np.abs(expected)), rel=0.3)


def test_systematic_error_edge_cases():
    from mhc_parity.harness.judging.metrics import systematic_error

    ones = np.ones((8, 4))
    assert systematic_error(ones, ones) == (0.0, 0.0)
    t, shift = systematic_error(ones + 0.5, ones)
    assert math.isinf(t) and shift == 0.5
    assert all(math.isnan(v) for v in systematic_error(ones, ones, token_axes=0))
    assert all(math.isnan(v) for v in systematic_error(np.ones((1, 4)), np.ones((1, 4)), token_axes=1))
    with_nan = ones.copy()
    with_nan[0, 0] = np.nan
    assert all(math.isnan(v) for v in systematic_error(with_nan, ones))


def test_leaf_metrics_record_systematic_error_only_for_token_major_leaves():
    rng = np.random.default_rng(1)
    oracle = rng.normal(size=(2, 16, 4))
    cand = oracle + 1e-3
    m = leaf_metrics(cand, oracle, oracle, dtype="float32", token_axes=2, oracle_systematic_t=1.5)
    assert m.cand_systematic_t > 1e6 and m.partner_systematic_t == 0.0 and m.oracle_systematic_t == 1.5
    plain = leaf_metrics(cand, oracle, oracle, dtype="float32")
    assert math.isnan(plain.cand_systematic_t) and math.isnan(plain.oracle_systematic_t)
    assert math.isnan(leaf_metrics(cand, oracle, dtype="float32", token_axes=2).cand_systematic_t)


# ── independent of the machine's BLAS ─────────────────────────────────────────────────

_BLAS_PROBE = """
import dataclasses, sys
import numpy as np
from mhc_parity.harness.judging.metrics import leaf_metrics
from mhc_parity.harness.engine.oracle_path import leaf_sensitivity
rng = np.random.default_rng(7)
exact = rng.standard_normal(1 << 16)
candidate = (exact + 1e-3 * rng.standard_normal(exact.size)).astype(np.float32)
partner = (exact + 1e-3 * rng.standard_normal(exact.size)).astype(np.float32)
metrics = leaf_metrics(candidate, partner, exact, dtype="float32")
print([float(v).hex() for v in dataclasses.astuple(metrics) if isinstance(v, float)])
draws = [exact + 1e-3 * rng.standard_normal(exact.size) for _ in range(4)]
print([float(v).hex() for v in dataclasses.astuple(leaf_sensitivity(draws, exact))])
"""


def test_metrics_and_oracle_deviations_do_not_depend_on_blas_threads():
    """BLAS splits a long dot over its threads, so `np.dot` and `np.linalg.norm` change
    their last bits with the thread count: rows computed on machines with other core
    counts would differ. The metrics and the oracle's sensitivities must not."""
    outputs = []
    for threads in ("1", "2"):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
        proc = subprocess.run(
            [sys.executable, "-c", _BLAS_PROBE], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, check=True
        )
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]


# ── one case's comparisons share a memo ───────────────────────────────────────────────


def _fields(metrics: LeafMetrics) -> list[str]:
    return [v.hex() if isinstance(v, float) else repr(v) for v in dataclasses.astuple(metrics)]


def test_a_memo_gives_the_same_metrics_and_computes_each_piece_once(monkeypatch):
    import mhc_parity.harness.judging.metrics as metrics_module

    rng = np.random.default_rng(3)
    oracle = rng.standard_normal((4, 8, 3))
    reference = (oracle + 1e-3 * rng.standard_normal(oracle.shape)).astype(BF16)
    kernel = (oracle + 1e-3 * rng.standard_normal(oracle.shape)).astype(BF16)
    kernel[0, 0, 0] = np.nan  # the NaN rules hold through the memo too
    comparisons = [(kernel, oracle), (reference, oracle), (kernel, reference)]  # a case's rows
    plain = [leaf_metrics(c, p, oracle, dtype=BF16, token_axes=2) for c, p in comparisons]

    calls = {"magnitudes": 0, "ulp": 0, "systematic": 0}
    for name, key in (("_magnitudes", "magnitudes"), ("ulp_spacing", "ulp"), ("systematic_error", "systematic")):
        original = getattr(metrics_module, name)

        def counting(*args, _original=original, _key=key, **kwargs):
            calls[_key] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(metrics_module, name, counting)
    memo = MetricsMemo()
    remembered = [leaf_metrics(c, p, oracle, dtype=BF16, token_axes=2, memo=memo) for c, p in comparisons]
    assert [_fields(m) for m in remembered] == [_fields(m) for m in plain]
    # three distinct arrays: each one's magnitudes once; spacing of two partners; three (array, oracle) pairs
    assert calls == {"magnitudes": 3, "ulp": 2, "systematic": 3}
    again = leaf_metrics(kernel, reference, oracle, dtype=BF16, token_axes=2, memo=memo)
    assert _fields(again) == _fields(plain[2]) and calls == {"magnitudes": 3, "ulp": 2, "systematic": 3}


def test_a_memo_keeps_its_arrays_so_their_identities_stay_theirs():
    memo = MetricsMemo()
    first = memo.magnitudes(np.array([3.0, 4.0]))  # a temporary: only the memo holds it now
    assert first == (4.0, 5.0)
    assert memo.magnitudes(np.array([6.0, 8.0])) == (8.0, 10.0)  # not a stale answer for a reused id


def test_a_forgotten_array_s_copies_go_and_come_back_the_same(monkeypatch):
    import mhc_parity.harness.judging.metrics as metrics_module

    rng = np.random.default_rng(5)
    oracle = rng.standard_normal((4, 8, 3))
    reference = (oracle + 1e-3 * rng.standard_normal(oracle.shape)).astype(BF16)
    kernel = (oracle + 1e-3 * rng.standard_normal(oracle.shape)).astype(BF16)
    memo = MetricsMemo()
    first = leaf_metrics(kernel, reference, oracle, dtype=BF16, token_axes=2, memo=memo)
    copy = weakref.ref(memo.upcast(kernel))  # the kernel's float64 copy, held by the memo alone
    kept = memo.upcast(reference)
    upcasts = {"count": 0}
    original = metrics_module.upcast

    def counting(a):
        upcasts["count"] += 1
        return original(a)

    monkeypatch.setattr(metrics_module, "upcast", counting)
    memo.forget([kernel])
    gc.collect()
    assert copy() is None  # gone with every value computed from it, the pairs with the oracle too
    again = leaf_metrics(kernel, reference, oracle, dtype=BF16, token_axes=2, memo=memo)
    assert _fields(again) == _fields(first) and upcasts["count"] == 1  # the kernel's copy, made again
    assert memo.upcast(reference) is kept  # what was not forgotten stays
