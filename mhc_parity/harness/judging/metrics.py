"""Comparison metrics for one leaf: candidate vs partner, each also vs the float64 oracle.

Pure NumPy: inputs of any float dtype (bfloat16 as `ml_dtypes` arrays) are upcast exactly to float64.
Conventions (tests pin each):

* NaN never passes: no nan-ignoring reduction; a NaN makes every error metric that reads it NaN,
  an Inf makes it inf (or NaN for inf − inf). NaN/Inf counts are reported separately.
* `max_rel_err = max|c − p| / max|p|`, `rel_rms_err = ‖c − p‖₂ / ‖p‖₂` (whole-leaf norms, so a
  near-zero element cannot dominate); denominator 0: 0/0 → 0.0, x/0 → inf.
* ULP errors divide by `ulp_spacing` at |p|, the smallest subnormal near zero, so `max_ulp` and
  `p99_ulp` (NumPy's "higher" percentile: an observed value) are informational only.
* Cosine: both all-zero → 1.0, one all-zero → 0.0, any NaN/Inf → NaN; clipped to [−1, 1].
* Oracle errors normalise the same way by the oracle; `oracle_ratio_* = cand / partner` with
  0/0 → 1.0, x/0 → inf, NaN or inf/inf → NaN. Without an oracle they are NaN and its counts 0.
* Empty leaves compare as identical; shapes must match exactly (else ValueError).
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

# name -> (explicit mantissa bits, minimum normal exponent).
DTYPE_FORMATS: dict[str, tuple[int, int]] = {
    name: (dtypes.mantissa_bits(name), dtypes.min_normal_exponent(name)) for name in dtypes.FLOAT_DTYPES
}


def dtype_name(dtype) -> str:
    """Canonical name of a supported float dtype (a name, alias, NumPy, ml_dtypes or JAX dtype); ValueError
    for anything not in `DTYPE_FORMATS`."""
    return dtypes.canonical_name(dtype)


def eps(dtype) -> float:
    """Machine epsilon of `dtype`: the spacing at 1.0 (bfloat16 2**-7, float32 2**-23)."""
    return dtypes.epsilon(dtype)


def ulp_spacing(values, dtype) -> np.ndarray:
    """Spacing of `dtype` at |values| (next representable number away from zero), float64 of the same shape.

    In the binade [2**e, 2**(e+1)) it is 2**(e − mantissa_bits); below the smallest normal (0 too) the
    smallest subnormal (gradual underflow; TPU flush-to-zero is not modelled). Values need not be
    representable in `dtype`. NaN and ±inf give NaN.
    """
    biased_exponent = (upcast(values).view(np.int64) >> 52) & 0x7FF  # float64's exponent field
    return _spacing_by_exponent(dtype_name(dtype))[biased_exponent]


@functools.cache
def _spacing_by_exponent(dtype: str) -> np.ndarray:
    """`ulp_spacing` for every float64 exponent field (0: zero and subnormals; 2047: inf and NaN): one
    lookup per element replaces frexp and ldexp."""
    mantissa_bits, min_exponent = DTYPE_FORMATS[dtype]
    table = np.array(
        [math.ldexp(1.0, max(field - 1023, min_exponent) - mantissa_bits) for field in range(2047)] + [math.nan]
    )
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class LeafMetrics:
    """Metrics of one leaf, named as the schema's columns: Python floats (NaN where undefined) and ints."""

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
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _error_ratio(cand_err: float, partner_err: float) -> float:
    if cand_err == 0.0 and partner_err == 0.0:
        return 1.0
    return safe_ratio(cand_err, partner_err)


def _magnitudes(a: np.ndarray) -> tuple[float, float]:
    largest = max_abs(a)
    return largest, l2_norm(a, largest)


def _rel_errors(
    actual: np.ndarray, expected: np.ndarray, expected_magnitudes: tuple[float, float]
) -> tuple[float, float, float]:
    """(max|a − e|, max|a − e| / max|e|, ‖a − e‖₂ / ‖e‖₂) for float64 inputs of one shape."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf -> NaN, by design
        diff = actual - expected
    largest = max_abs(diff)
    expected_max, expected_l2 = expected_magnitudes
    return largest, safe_ratio(largest, expected_max), safe_ratio(l2_norm(diff, largest), expected_l2)


def _cosine(a: np.ndarray, b: np.ndarray, a_l2: float, b_l2: float) -> float:
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
    """What `leaf_metrics` computes from one array or pair, computed once per array (same bits).

    A case meets the same arrays again and again (the oracle's leaf, a path as candidate and as partner):
    pass one memo to every `leaf_metrics` call of a case. Keys are array identities, so the memo keeps each
    array alive; drop it with the case or `forget` arrays no comparison will meet (its float64 copies and
    spacings, 16 bytes an element, are most of a case's memory). `remember=False` computes everything every
    time.
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
        """Drop every value computed from any of `arrays` or their upcasts, and the hold on them."""
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
    """Every metric of one leaf (module docstring for the edge cases).

    candidate, partner: array-likes of one shape, any float dtype. oracle: None or the same shape (float64).
    dtype: the compared leaf's dtype, the ULP unit. sensitivity: the oracle's `Sensitivity`
    (oracle_sensitivity_*, NaN without). token_axes: leading axes that index tokens (0: none); with an
    oracle, each side's `systematic_error` against it is recorded. oracle_systematic_t,
    oracle_backend_shift: the rounding model's t statistic and the backend's shared shift on this leaf
    (`OracleOutputs`). memo: a `MetricsMemo` shared by one case's calls. ValueError if the shapes differ or
    `dtype` is unsupported.
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
