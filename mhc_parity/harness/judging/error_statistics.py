"""The reductions the metrics and the oracle's sensitivities share, in float64.

Kept apart from `mhc_parity.harness.judging.metrics` on purpose: the oracle cache's key digests the sources
the oracle's answers are computed with (`mhc_parity.harness.stores.oracle_cache.oracle_sources`), and its
sensitivities and systematic statistics use only these. So an edit of the metrics does
not recompute every oracle answer; an edit here does.
"""

from __future__ import annotations

import math

import numpy as np


def upcast(a) -> np.ndarray:
    """Any float array-like (incl. ml_dtypes.bfloat16) -> float64 ndarray, same shape
    (`a` itself when it is one already: nothing here writes to its inputs)."""
    return np.asarray(a).astype(np.float64, copy=False)


def safe_ratio(num: float, den: float) -> float:
    """num / den for non-negative errors: 0/0 -> 0, x/0 -> inf, NaN or inf/inf -> NaN."""
    if math.isnan(num) or math.isnan(den):
        return math.nan
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    if math.isinf(num) and math.isinf(den):
        return math.nan
    return num / den


def max_abs(a: np.ndarray) -> float:
    """max |a| over all elements; NaN if any NaN; 0.0 for an empty array."""
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a)))  # np.max propagates NaN


def l2_norm(a: np.ndarray, a_max_abs: float | None = None) -> float:
    """‖a‖₂ of a float64 array, scaled by max|a| (`a_max_abs` if known) so squares cannot
    overflow; NaN/inf propagate.

    Sums with NumPy's pairwise summation, never BLAS (`np.dot`, `np.linalg.norm`): OpenBLAS
    splits a long dot over its threads and picks a kernel per CPU model, so its last bits
    change with the core count and the CPU (measured: 1 vs 2 threads from 20,000
    elements, and the Haswell kernel against this machine's), while rows merged from
    several machines must equal one machine's run. Its idle threads also spin on the
    cores the compiles need.
    """
    scale = max_abs(a) if a_max_abs is None else a_max_abs
    if scale == 0.0 or not math.isfinite(scale):
        return scale
    return scale * math.sqrt(float(np.sum(np.square(a / scale))))


def systematic_error(actual, expected, *, token_axes: int = 2) -> tuple[float, float]:
    """The largest error shared by every token: (t statistic, shift), float64.

    actual, expected: array-likes of one shape whose first `token_axes` axes index
    tokens (T of them) and whose remaining axes index G groups (a stream, a matrix
    entry, a feature). Per group, the mean signed error over the tokens is measured
    against its standard error: t = |mean(e)| / (std(e) / sqrt(T)). Rounding noise that
    differs from token to token averages out (t of order one); a perturbation shared by
    every token — a parameter rounded, a statistic computed in low precision — shifts
    every token the same way, and its t grows like sqrt(T) while its RMS error need not
    grow at all. Returns the largest t over the groups and that group's |mean(e)|
    normalised by max|expected|. A group with zero spread has t = 0 when its mean is 0
    and inf otherwise. NaN when there are no token axes or fewer than 2 tokens; NaN or
    Inf inputs give NaN.
    """
    errors = _token_errors(actual, expected, token_axes)
    if errors is None or errors[0].shape[0] < 2:
        return math.nan, math.nan
    error, e = errors
    tokens = error.shape[0]
    mean = error.mean(axis=0)
    standard_error = error.std(axis=0, ddof=1) / math.sqrt(tokens)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(standard_error > 0, np.abs(mean) / standard_error, np.where(mean == 0, 0.0, np.inf))
    worst = int(np.argmax(t))
    return float(t[worst]), safe_ratio(float(abs(mean[worst])), max_abs(e))


def shared_shift(actual, expected, *, token_axes: int = 2) -> float:
    """The largest error shared by every token, whatever its spread: max over the groups of
    |mean(actual - expected)| over the tokens, normalised by max|expected|, float64 (axes as
    for `systematic_error`). NaN when there are no token axes, no values, or non-finite ones."""
    errors = _token_errors(actual, expected, token_axes)
    if errors is None:
        return math.nan
    error, e = errors
    return safe_ratio(float(np.max(np.abs(error.mean(axis=0)))), max_abs(e))


def _token_errors(actual, expected, token_axes: int) -> tuple[np.ndarray, np.ndarray] | None:
    """((T, G) signed errors actual - expected, tokens by groups; expected upcast), float64;
    None when there are no token axes, no values, or non-finite ones."""
    a, e = upcast(actual), upcast(expected)
    if token_axes < 1 or a.ndim < token_axes or a.size == 0:
        return None
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(e))):
        return None
    return (a - e).reshape(int(np.prod(a.shape[:token_axes])), -1), e


def _pairwise_sum(a: np.ndarray, b: np.ndarray) -> float:
    """Σ a·b by NumPy's pairwise summation (never BLAS: see `l2_norm`)."""
    return float(np.sum(a * b))


def gain(actual, expected) -> float:
    """The error's component along the expected value: ⟨a − e, e⟩ / ⟨e, e⟩, float64, signed.

    A leaf scaled by (1 + g) has gain g exactly; rounding noise, uncorrelated with the value,
    has a gain of order its RMS error over the square root of the leaf's degrees of freedom.
    0 when both are all-zero, inf when only `expected` is; NaN or Inf inputs give NaN.
    """
    a, e = upcast(actual), upcast(expected)
    if a.size == 0:
        return 0.0
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(e))):
        return math.nan
    scale = max_abs(e)
    if scale == 0.0:
        return 0.0 if max_abs(a) == 0.0 else math.inf
    unit = e / scale
    return _pairwise_sum((a - e) / scale, unit) / _pairwise_sum(unit, unit)


def draw_deviations(noisy, exact) -> tuple[list[float], list[float], list[float], list[np.ndarray]]:
    """Per noisy draw of one leaf: its max and RMS deviation from `exact` (normalised by
    max|exact| and ‖exact‖₂), its `gain` against `exact`, and the deviation itself.

    noisy: draws of one shape, exact: that shape (float64). The same numbers as each draw's
    own `max_abs`, `l2_norm` and `gain`, with what depends on `exact` alone computed once.
    """
    e = upcast(exact)
    scale_max = max_abs(e)
    scale_l2 = l2_norm(e, scale_max)
    unit = e / scale_max if scale_max and math.isfinite(scale_max) else None
    unit_norm = None if unit is None else _pairwise_sum(unit, unit)
    max_devs, rms_devs, gains, diffs = [], [], [], []
    for value in noisy:
        a = upcast(value)
        diff = a - e
        max_dev = max_abs(diff)
        l2_dev = l2_norm(diff, max_dev)
        max_devs.append(max_dev / scale_max if scale_max else max_dev)
        rms_devs.append(l2_dev / scale_l2 if scale_l2 else l2_dev)
        finite = unit is not None and math.isfinite(max_dev) and bool(np.all(np.isfinite(a)))
        gains.append(_pairwise_sum(diff / scale_max, unit) / unit_norm if finite else gain(a, e))
        diffs.append(diff)
    return max_devs, rms_devs, gains, diffs


def effective_dof(deviations) -> float:
    """The effective degrees of freedom of ‖d‖² over random draws d of one leaf's error.

    deviations: N >= 2 arrays of one shape (draws of the same random error). Satterthwaite's
    k = tr(Σ)² / tr(Σ²) of the draws' covariance Σ, from unbiased estimates over distinct
    pairs: tr(Σ)² from ‖d_i‖²‖d_j‖², tr(Σ²) from (d_i·d_j)² (for Gaussian draws both are
    unbiased when i ≠ j). ‖d‖² then behaves like tr(Σ)·χ²_k / k. One error direction gives
    k = 1 exactly; independent errors on m elements give k ≈ m. Clipped to [1, size].
    """
    draws = np.stack([upcast(d).ravel() for d in deviations])
    if len(draws) < 2:
        raise ValueError(f"effective_dof needs at least 2 draws, got {len(draws)}")
    size = draws.shape[1]
    scale = max_abs(draws)
    if size == 0 or scale == 0.0 or not math.isfinite(scale):
        return 1.0
    draws /= scale  # the stack is this function's own copy
    # The draws' Gram matrix by einsum's own loops (never BLAS: see `l2_norm`).
    gram = np.einsum("ik,jk->ij", draws, draws)
    distinct = ~np.eye(len(draws), dtype=bool)
    squared = np.diag(gram)
    trace_squared = float(np.sum(np.outer(squared, squared)[distinct]))
    trace_of_square = float(np.sum(np.square(gram)[distinct]))
    if trace_of_square <= 0.0:
        return float(size)
    return float(min(max(trace_squared / trace_of_square, 1.0), size))


def statistic_dof(values, ceiling: float) -> float:
    """Degrees of freedom of a positive statistic X (e.g. a max error) whose square is
    modelled as c·χ²_k / k, matched to the spread of its draws: k = 2 / CV²(X²).

    values: N >= 2 draws of X. Clipped to [1, ceiling]; identical draws give `ceiling`.
    """
    squares = np.square(np.asarray(values, dtype=np.float64))
    if squares.size < 2:
        raise ValueError(f"statistic_dof needs at least 2 draws, got {squares.size}")
    mean = float(np.mean(squares))
    if mean == 0.0 or not math.isfinite(mean):
        return float(ceiling)
    variance = float(np.var(squares, ddof=1))
    if variance == 0.0:
        return float(ceiling)
    return float(min(max(2.0 * mean * mean / variance, 1.0), ceiling))
