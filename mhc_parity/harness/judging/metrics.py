"""Comparison metrics for one leaf: candidate vs partner, each also vs the float64 oracle.

Pure NumPy (no JAX import): inputs are array-likes of any float dtype — float32,
float64, or bfloat16 as `ml_dtypes.bfloat16` NumPy arrays — and every metric is computed
in float64 from the upcast inputs (the upcast is exact for all of those formats).

Conventions, chosen deliberately (tests pin each one):

* **NaN never passes.** No nan-ignoring reduction is used anywhere. A NaN in the
  candidate or the partner makes every error metric that reads it NaN; an Inf makes it
  inf (or NaN for inf − inf, e.g. both sides +inf at the same place). The NaN/Inf
  counts are reported separately so the policy can name them.
* **Normalisation.** `max_rel_err = max|c − p| / max|p|` and
  `rel_rms_err = ‖c − p‖₂ / ‖p‖₂` (whole-leaf norms, not element-wise ratios, so an
  element that happens to be near zero cannot dominate). When the denominator is 0:
  numerator 0 → 0.0 (both all-zero: identical), numerator > 0 → inf.
* **ULP errors** are `|c − p|` divided by the spacing of `dtype` at `|p|` (see
  `ulp_spacing`). Near zero the spacing is the smallest subnormal, so a tiny absolute
  difference around a zero partner counts as a huge number of ulps; `max_ulp` and
  `p99_ulp` are informational for that reason, and the policy bounds the normalised
  errors instead. `p99_ulp` is the 99th percentile with NumPy's "higher" method, i.e.
  an observed element value, never an interpolation.
* **Cosine** similarity of the flattened leaves: both all-zero → 1.0; exactly one
  all-zero → 0.0 (no direction in common); any NaN/Inf in either → NaN. Rounding can
  push a dot product of unit vectors a hair past ±1; the result is clipped to [−1, 1].
* **Oracle errors** use the same normalisation with the oracle as the expected value:
  `cand_oracle_max_err = max|c − o| / max|o|`, `cand_oracle_rms_err = ‖c − o‖₂/‖o‖₂`,
  and the same for the partner. The ratios `oracle_ratio_* = cand / partner` follow:
  0/0 → 1.0 (both exactly equal to the oracle: the candidate is as good as the
  partner), x/0 with x > 0 → inf, anything involving NaN → NaN, inf/inf → NaN.
  Without an oracle the six oracle float fields are NaN and the oracle counts 0.
* **Empty leaves** (size 0) compare as identical: errors 0.0, ulps 0.0, cosine 1.0.
* **Shapes must match exactly** (no broadcasting); otherwise `ValueError` naming both
  shapes (and the oracle's).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.harness.judging.error_statistics import gain, l2_norm, max_abs, safe_ratio, systematic_error, upcast
from mhc_parity.records import dtypes
from mhc_parity.records.gain_rule import peak_to_l2

__all__ = [
    "DTYPE_FORMATS",
    "LeafMetrics",
    "dtype_name",
    "eps",
    "leaf_metrics",
    "systematic_error",
    "ulp_spacing",
]

# name -> (explicit mantissa bits, minimum normal exponent), from `mhc_parity.records.dtypes`.
# eps = 2**-mantissa_bits; smallest normal = 2**min_exponent; smallest subnormal =
# 2**(min_exponent - mantissa_bits).
DTYPE_FORMATS: dict[str, tuple[int, int]] = {
    name: (dtypes.mantissa_bits(name), dtypes.min_normal_exponent(name)) for name in dtypes.FLOAT_DTYPES
}


def dtype_name(dtype) -> str:
    """Canonical name of a supported float dtype (`mhc_parity.records.dtypes.canonical_name`): a name
    or alias, a NumPy dtype, a scalar type such as `np.float32` or `ml_dtypes.bfloat16`, or
    a JAX dtype. Raises ValueError for anything that is not one of `DTYPE_FORMATS`."""
    return dtypes.canonical_name(dtype)


def eps(dtype) -> float:
    """Machine epsilon of `dtype`: the spacing at 1.0 (bfloat16 2**-7, float32 2**-23)."""
    return dtypes.epsilon(dtype)


def ulp_spacing(values, dtype) -> np.ndarray:
    """Spacing of `dtype` at |values|: the distance to the next representable number
    away from zero.

    values: array-like of any float dtype, any shape. dtype: float64, float32, float16
    or bfloat16. Returns a float64 array of the same shape.

    For |v| in the binade [2**e, 2**(e+1)) the spacing is 2**(e − mantissa_bits), so at
    a power of two it is the (larger) spacing of the binade above. For |v| below the
    smallest normal — including 0 — it is the smallest subnormal of `dtype` (IEEE
    gradual underflow, as `np.spacing` and ml_dtypes have it; TPU flush-to-zero is not
    modelled). Values need not be representable in `dtype` (an oracle's float64 values
    are measured in the binade they fall in); values beyond the dtype's largest finite
    number keep the binade formula. NaN and ±inf give NaN.
    """
    biased_exponent = (upcast(values).view(np.int64) >> 52) & 0x7FF  # float64's exponent field
    return _spacing_by_exponent(dtype_name(dtype))[biased_exponent]


@functools.cache
def _spacing_by_exponent(dtype: str) -> np.ndarray:
    """`ulp_spacing` for every float64 exponent field: a float64's binade is its exponent
    field − 1023 (field 0: zero and subnormals, below every dtype's smallest normal;
    field 2047: inf and NaN), so one lookup per element replaces frexp and ldexp."""
    mantissa_bits, min_exponent = DTYPE_FORMATS[dtype]
    table = np.array(
        [math.ldexp(1.0, max(field - 1023, min_exponent) - mantissa_bits) for field in range(2047)] + [math.nan]
    )
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class LeafMetrics:
    """Metrics of one leaf. Field names are exactly schema metric/count columns.

    Floats are Python floats (NaN where a metric is undefined, e.g. oracle fields
    without an oracle); counts are Python ints.
    """

    max_abs_err: float
    max_rel_err: float
    rel_rms_err: float
    max_ulp: float
    p99_ulp: float
    cosine: float
    nan_count: int
    inf_count: int
    partner_nan_count: int
    partner_inf_count: int
    oracle_nan_count: int
    oracle_inf_count: int
    cand_oracle_max_err: float
    partner_oracle_max_err: float
    oracle_ratio_max: float
    cand_oracle_rms_err: float
    partner_oracle_rms_err: float
    oracle_ratio_rms: float
    oracle_sensitivity_max: float
    oracle_sensitivity_rms: float
    cand_oracle_gain: float
    partner_oracle_gain: float
    oracle_sensitivity_gain: float
    oracle_peak_to_l2: float
    oracle_sensitivity_dof_max: float
    oracle_sensitivity_dof_rms: float
    oracle_draws: float
    cand_systematic_t: float
    cand_systematic_shift: float
    partner_systematic_t: float
    oracle_systematic_t: float
    oracle_backend_shift: float

    def as_row_fields(self) -> dict:
        """The fields as a {column: value} dict, ready to merge into a schema row."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _error_ratio(cand_err: float, partner_err: float) -> float:
    """Oracle error ratio: 0/0 -> 1.0 (equally exact), x/0 -> inf, NaN, inf/inf -> NaN."""
    if cand_err == 0.0 and partner_err == 0.0:
        return 1.0
    return safe_ratio(cand_err, partner_err)


def _magnitudes(a: np.ndarray) -> tuple[float, float]:
    """(max|a|, ‖a‖₂): what errors against `a` are normalised by."""
    largest = max_abs(a)
    return largest, l2_norm(a, largest)


def _rel_errors(
    actual: np.ndarray, expected: np.ndarray, expected_magnitudes: tuple[float, float]
) -> tuple[float, float, float]:
    """(max|a − e|, max|a − e| / max|e|, ‖a − e‖₂ / ‖e‖₂), float64 inputs of one shape;
    expected_magnitudes: `_magnitudes(expected)`."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf -> NaN, by design
        diff = actual - expected
    largest = max_abs(diff)
    expected_max, expected_l2 = expected_magnitudes
    return largest, safe_ratio(largest, expected_max), safe_ratio(l2_norm(diff, largest), expected_l2)


def _cosine(a: np.ndarray, b: np.ndarray, a_l2: float, b_l2: float) -> float:
    """Cosine of the angle between a and b, given ‖a‖₂ and ‖b‖₂; NaN unless both are finite."""
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return math.nan
    na, nb = a_l2, b_l2
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    dot = float(np.sum((a / na) * (b / nb)))  # not np.dot: see `mhc_parity.harness.judging.error_statistics.l2_norm`
    return min(1.0, max(-1.0, dot))


def _counts(a: np.ndarray) -> tuple[int, int]:
    return int(np.count_nonzero(np.isnan(a))), int(np.count_nonzero(np.isinf(a)))


class MetricsMemo:
    """What `leaf_metrics` computes from one array or one pair, computed once per array.

    One case's comparisons meet the same arrays again and again: the oracle's leaf is the
    expected value of every path's row, a vs_oracle row's partner *is* the oracle, and a
    path is the candidate of one row and the partner of another. Pass one memo to every
    `leaf_metrics` call of a case (`mhc_parity.harness.engine.runner.Runner.run_case`) and each upcast,
    magnitude, NaN/Inf count, ULP spacing, error against an expected array and
    systematic statistic is computed once; the values are the same as without it, bit
    for bit.

    Keys are the arrays' identities, and the memo keeps every array it has seen alive so
    that an identity cannot be reused by another array while the memo lives. Drop it
    with the case, or `forget` the arrays no comparison left will meet: what it holds of
    them (float64 copies and ULP spacings, 16 bytes an element) is the most of a case's
    memory. `MetricsMemo(remember=False)` computes everything every time.
    """

    def __init__(self, remember: bool = True):
        self._values: dict[tuple, tuple[object, tuple]] | None = {} if remember else None

    def _once(self, what: tuple, arrays: tuple, compute):
        if self._values is None:
            return compute()
        key = (*what, *map(id, arrays))
        entry = self._values.get(key)
        if entry is None:
            entry = self._values[key] = (compute(), arrays)
        return entry[0]

    def forget(self, arrays: Iterable) -> None:
        """Drop every value computed from any of `arrays` or from their upcasts (alone or in a
        pair), and the memo's hold on them; a later call computes it again, the same."""
        if self._values is None:
            return
        gone = {id(a) for a in arrays}
        gone |= {id(value) for key, (value, _) in self._values.items() if key[0] == "upcast" and key[1] in gone}
        self._values = {key: entry for key, entry in self._values.items() if gone.isdisjoint(map(id, entry[1]))}

    def upcast(self, a) -> np.ndarray:
        return self._once(("upcast",), (a,), lambda: upcast(a))

    def magnitudes(self, a: np.ndarray) -> tuple[float, float]:
        return self._once(("magnitudes",), (a,), lambda: _magnitudes(a))

    def counts(self, a: np.ndarray) -> tuple[int, int]:
        return self._once(("counts",), (a,), lambda: _counts(a))

    def rel_errors(self, actual: np.ndarray, expected: np.ndarray) -> tuple[float, float, float]:
        return self._once(
            ("rel_errors",), (actual, expected), lambda: _rel_errors(actual, expected, self.magnitudes(expected))
        )

    def ulp_spacing(self, a: np.ndarray, dtype: str) -> np.ndarray:
        return self._once(("ulp_spacing", dtype), (a,), lambda: ulp_spacing(a, dtype))

    def gain(self, actual: np.ndarray, expected: np.ndarray) -> float:
        return self._once(("gain",), (actual, expected), lambda: gain(actual, expected))

    def systematic_error(self, actual: np.ndarray, expected: np.ndarray, token_axes: int) -> tuple[float, float]:
        return self._once(
            ("systematic", token_axes),
            (actual, expected),
            lambda: systematic_error(actual, expected, token_axes=token_axes),
        )


def leaf_metrics(
    candidate,
    partner,
    oracle=None,
    *,
    dtype,
    sensitivity: Sensitivity | None = None,
    token_axes: int = 0,
    oracle_systematic_t: float | None = None,
    oracle_backend_shift: float | None = None,
    memo: MetricsMemo | None = None,
) -> LeafMetrics:
    """Every metric of one leaf.

    candidate, partner: array-likes of one shape, any float dtype (bfloat16 as
    ml_dtypes arrays). oracle: None or an array-like of the same shape (float64 in
    practice). dtype: the compared leaf's dtype, the unit of the ULP metrics.
    sensitivity: None or the oracle's `Sensitivity` to one rounding per operation
    (`mhc_parity.harness.engine.oracle_path.OracleOutputs`), recorded as oracle_sensitivity_* and
    oracle_draws; NaN when not given. With an oracle, each side's `gain` against it (its
    error's component along the oracle's value) is recorded too, and the oracle's max|o|/‖o‖₂
    (`mhc_parity.records.gain_rule`: what carries an element floor onto the gain). token_axes: how many
    leading axes index tokens (0: the leaf has no token axis); with an oracle, the
    candidate's and the partner's `systematic_error` against it are recorded (NaN
    otherwise). oracle_systematic_t: the t statistic the rounding model itself produces
    on this leaf (`OracleOutputs.systematic`). oracle_backend_shift: the shift the backend's
    own primitives may share on this leaf (`OracleOutputs.backend_shift`). memo: a `MetricsMemo` shared by the calls
    of one case (same results, less work).
    Raises ValueError if the shapes differ or `dtype` is unsupported.
    See the module docstring for every edge case.
    """
    name = dtype_name(dtype)
    memo = memo or MetricsMemo(remember=False)
    c, p = memo.upcast(candidate), memo.upcast(partner)
    o = None if oracle is None else memo.upcast(oracle)
    if c.shape != p.shape or (o is not None and o.shape != c.shape):
        oracle_part = "" if o is None else f", oracle shape {o.shape}"
        raise ValueError(f"shape mismatch: candidate shape {c.shape} vs partner shape {p.shape}{oracle_part}")

    max_abs_err, max_rel, rel_rms = memo.rel_errors(c, p)
    if c.size == 0:
        max_ulp = p99_ulp = 0.0
    else:
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf propagate by design
            ulps = np.abs(c - p) / memo.ulp_spacing(p, name)
        if np.isnan(ulps).any():
            max_ulp = p99_ulp = math.nan
        else:
            max_ulp = float(np.max(ulps))
            p99_ulp = float(np.percentile(ulps, 99.0, method="higher"))

    nan_c, inf_c = memo.counts(c)
    nan_p, inf_p = memo.counts(p)
    if o is None:
        nan_o = inf_o = 0
        c_o_max = p_o_max = c_o_rms = p_o_rms = ratio_max = ratio_rms = c_gain = p_gain = o_peak = math.nan
    else:
        nan_o, inf_o = memo.counts(o)
        _, c_o_max, c_o_rms = memo.rel_errors(c, o)
        _, p_o_max, p_o_rms = memo.rel_errors(p, o)
        ratio_max = _error_ratio(c_o_max, p_o_max)
        ratio_rms = _error_ratio(c_o_rms, p_o_rms)
        c_gain, p_gain = memo.gain(c, o), memo.gain(p, o)
        o_peak = peak_to_l2(*memo.magnitudes(o))
    if o is None or not token_axes:
        c_t = c_shift = p_t = math.nan
    else:
        c_t, c_shift = memo.systematic_error(c, o, token_axes)
        p_t, _ = memo.systematic_error(p, o, token_axes)
    return LeafMetrics(
        max_abs_err=max_abs_err,
        max_rel_err=max_rel,
        rel_rms_err=rel_rms,
        max_ulp=max_ulp,
        p99_ulp=p99_ulp,
        cosine=_cosine(c, p, memo.magnitudes(c)[1], memo.magnitudes(p)[1]),
        nan_count=nan_c,
        inf_count=inf_c,
        partner_nan_count=nan_p,
        partner_inf_count=inf_p,
        oracle_nan_count=nan_o,
        oracle_inf_count=inf_o,
        cand_oracle_max_err=c_o_max,
        partner_oracle_max_err=p_o_max,
        oracle_ratio_max=ratio_max,
        cand_oracle_rms_err=c_o_rms,
        partner_oracle_rms_err=p_o_rms,
        oracle_ratio_rms=ratio_rms,
        oracle_sensitivity_max=math.nan if sensitivity is None else sensitivity.max,
        oracle_sensitivity_rms=math.nan if sensitivity is None else sensitivity.rms,
        cand_oracle_gain=c_gain,
        partner_oracle_gain=p_gain,
        oracle_sensitivity_gain=math.nan if sensitivity is None else sensitivity.gain,
        oracle_peak_to_l2=o_peak,
        oracle_sensitivity_dof_max=math.nan if sensitivity is None else sensitivity.dof_max,
        oracle_sensitivity_dof_rms=math.nan if sensitivity is None else sensitivity.dof_rms,
        oracle_draws=math.nan if sensitivity is None else float(sensitivity.draws),
        cand_systematic_t=c_t,
        cand_systematic_shift=c_shift,
        partner_systematic_t=p_t,
        oracle_systematic_t=math.nan if oracle_systematic_t is None else float(oracle_systematic_t),
        oracle_backend_shift=math.nan if oracle_backend_shift is None else float(oracle_backend_shift),
    )
