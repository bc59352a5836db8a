"""The reductions the metrics and the oracle's sensitivities share, in float64.

Kept apart from `metrics` on purpose: the oracle cache's key digests these sources
(`oracle_cache.oracle_sources`), so a metrics edit does not recompute every oracle answer.
"""

from __future__ import annotations

import math

import numpy as np


def upcast(a) -> np.ndarray:
    """Any float array-like (bfloat16 too) -> float64 ndarray of the same shape (`a` itself when it is one:
    nothing here writes to its inputs)."""
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
    """max |a|; NaN if any NaN; 0.0 for an empty array."""
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a)))  # np.max propagates NaN


def l2_norm(a: np.ndarray, a_max_abs: float | None = None) -> float:
    """‖a‖₂ of a float64 array, scaled by max|a| (`a_max_abs` if known) so squares cannot overflow; NaN/inf
    propagate. Summed by NumPy, never BLAS, whose last bits change with thread count and CPU
    (docs/speed.md): rows merged from several machines must equal one machine's."""
    scale = max_abs(a) if a_max_abs is None else a_max_abs
    if scale == 0.0 or not math.isfinite(scale):
        return scale
    return scale * math.sqrt(float(np.sum(np.square(a / scale))))


def systematic_error(actual, expected, *, token_axes: int = 2) -> tuple[float, float]:
    """The largest error shared by every token: (t statistic, shift), float64.

    actual, expected: one shape, the first `token_axes` axes index T tokens, the rest G groups. Per group t
    = |mean(e)| / (std(e) / sqrt(T)): rounding noise averages out (t of order one), a shift every token
    shares grows like sqrt(T) (docs/judging.md). Returns the largest t and that group's |mean(e)| /
    max|expected|. Zero spread: t = 0 for a zero mean, else inf. NaN with no token axes, fewer than 2
    tokens, or NaN/Inf inputs.
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
    """max over groups of |mean(actual − expected)| over the tokens / max|expected|, whatever the spread
    (axes as `systematic_error`); NaN with no token axes, no values or non-finite ones."""
    errors = _token_errors(actual, expected, token_axes)
    if errors is None:
        return math.nan
    error, e = errors
    return safe_ratio(float(np.max(np.abs(error.mean(axis=0)))), max_abs(e))


def _token_errors(actual, expected, token_axes: int) -> tuple[np.ndarray, np.ndarray] | None:
    """((T, G) errors actual − expected, expected upcast), or None with no token axes, no values, or
    non-finite ones."""
    a, e = upcast(actual), upcast(expected)
    if token_axes < 1 or a.ndim < token_axes or a.size == 0:
        return None
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(e))):
        return None
    return (a - e).reshape(int(np.prod(a.shape[:token_axes])), -1), e


def _pairwise_sum(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum(a * b))


def gain(actual, expected) -> float:
    """The error's component along the expected value, ⟨a − e, e⟩ / ⟨e, e⟩ (float64, signed): a leaf scaled
    by (1 + g) has gain g. 0 when both are all-zero, inf when only `expected` is; NaN/Inf inputs give NaN."""
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
    """Per noisy draw of one leaf (all of `exact`'s shape): its max and RMS deviation from `exact` (over
    max|exact| and ‖exact‖₂), its `gain`, and the deviation itself; as `max_abs`, `l2_norm` and `gain` give
    them, with what depends on `exact` alone computed once."""
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
    """Satterthwaite's degrees of freedom tr(Σ)² / tr(Σ²) of ‖d‖² over N >= 2 draws d of one leaf's error,
    estimated without bias from distinct pairs (docs/judging.md); clipped to [1, size]."""
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
    """Degrees of freedom k = 2 / CV²(X²) of a positive statistic X whose square is modelled as c·χ²_k / k,
    from N >= 2 draws; clipped to [1, ceiling] (identical draws: `ceiling`)."""
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
