"""The oracle's statistics of a token-major leaf's draws, accumulated a token chunk at a time.

The chunked oracle (`mhc_parity.mhc.oracle_chunks`) never holds a draw whole; `TokenLeafDraws` keeps per
draw scaled sums and maxima, the draws' scaled Gram matrix, and per group Chan's merged means and squared
deviations. `finish` equals `error_statistics`' functions on the whole arrays up to a float64 reassociation.
Part of the oracle cache's source key.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from mhc_parity.harness.judging.error_statistics import l2_norm, max_abs, safe_ratio, upcast


@dataclasses.dataclass
class _GroupMoments:
    """Per group (G,): token count, mean and sum of squared deviations from the mean, float64."""

    count: int = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    finite: bool = True

    def add(self, errors: np.ndarray) -> None:
        self.finite = self.finite and bool(np.all(np.isfinite(errors)))
        if errors.shape[0] == 0:
            return
        mean = errors.mean(axis=0)
        m2 = np.square(errors - mean).sum(axis=0)
        if self.mean is None:
            self.count, self.mean, self.m2 = errors.shape[0], mean, m2
            return
        count = self.count + errors.shape[0]
        delta = mean - self.mean
        self.mean = self.mean + delta * (errors.shape[0] / count)
        self.m2 = self.m2 + m2 + np.square(delta) * (self.count * errors.shape[0] / count)
        self.count = count


def _scaled_add(scale: float, total, chunk_scale: float, chunk_total):
    """Merge (scale, total) with (chunk_scale, chunk_total), each total a sum of products over its scale²:
    the merged sum over the larger scale²."""
    if chunk_scale > scale:
        return chunk_scale, total * (scale / chunk_scale) ** 2 + chunk_total
    return scale, total + chunk_total * (chunk_scale / scale) ** 2


class TokenLeafDraws:
    """Chunk-wise statistics of one token-major leaf's N >= 2 noisy draws against the exact leaf; shifted:
    each chunk also brings the backend-shift draw."""

    def __init__(self, draws: int, shifted: bool = False):
        if draws < 2:
            raise ValueError(f"the statistics of a leaf's draws need at least 2 draws, got {draws}")
        self.draws, self.shifted = draws, shifted
        self.size = 0
        self.max_dev = np.zeros(draws)
        self.max_value = np.zeros(draws)
        self.finite = np.ones(draws, bool)
        self.l2 = [(0.0, 0.0)] * draws  # (scale, sum of (deviation / scale)²)
        self.inner = [(0.0, 0.0)] * draws  # (scale of exact, sum of deviation·exact / scale²)
        self.gram = (0.0, np.zeros((draws, draws)))  # (scale of every deviation, Gram / scale²)
        self.moments = [_GroupMoments() for _ in range(draws)]
        self.shift = _GroupMoments()

    def add(self, exact, noisy, shifted=None) -> None:
        """One chunk: exact (tokens, ...) and each draw's values of the same tokens, any float dtype."""
        if len(noisy) != self.draws or (shifted is None) == self.shifted:
            raise ValueError(f"a chunk brings {len(noisy)} draws (shifted: {shifted is not None}), expected {self}")
        e = upcast(exact)
        e = e.reshape(e.shape[0], -1)
        self.size += e.size
        e_scale = max_abs(e)
        unit = e / e_scale if e_scale and math.isfinite(e_scale) else None
        deviations = np.empty((self.draws, e.size))
        for d, value in enumerate(noisy):
            a = upcast(value).reshape(e.shape)
            diff = a - e
            deviations[d] = diff.ravel()
            dev = max_abs(diff)
            self.max_dev[d] = np.maximum(self.max_dev[d], dev)
            self.max_value[d] = np.maximum(self.max_value[d], max_abs(a))
            self.finite[d] &= bool(np.all(np.isfinite(a)))
            if dev and math.isfinite(dev):
                self.l2[d] = _scaled_add(*self.l2[d], dev, float(np.sum(np.square(diff / dev))))
            if unit is not None:
                self.inner[d] = _scaled_add(*self.inner[d], e_scale, float(np.sum((diff / e_scale) * unit)))
            self.moments[d].add(diff)
        every = max_abs(deviations)
        if every and math.isfinite(every):
            deviations /= every
            # The Gram matrix by einsum's own loops, never BLAS (`error_statistics.l2_norm`).
            self.gram = _scaled_add(*self.gram, every, np.einsum("ik,jk->ij", deviations, deviations))
        if shifted is not None:
            self.shift.add(upcast(shifted).reshape(e.shape) - e)

    def finish(self, exact) -> dict:
        """The statistics over every token (`exact`: the whole leaf, tokens first): max_devs, rms_devs,
        gains, dof_rms, systematic (per draw t) and shift (NaN without the shifted draw), as
        `error_statistics` computes them."""
        e = upcast(exact)
        if e.size != self.size:
            raise ValueError(f"the chunks held {self.size} values of the leaf, the exact leaf {e.size}")
        e_finite = bool(np.all(np.isfinite(e)))
        scale_max = max_abs(e)
        scale_l2 = l2_norm(e, scale_max)
        unit_norm = None
        if scale_max and math.isfinite(scale_max):
            unit = e / scale_max
            unit_norm = float(np.sum(unit * unit))
        max_devs, rms_devs, gains = [], [], []
        for d in range(self.draws):
            dev = float(self.max_dev[d])
            scale, ssq = self.l2[d]
            l2 = dev if dev == 0.0 or not math.isfinite(dev) else dev * math.sqrt(ssq * (scale / dev) ** 2)
            max_devs.append(dev / scale_max if scale_max else dev)
            rms_devs.append(l2 / scale_l2 if scale_l2 else l2)
            gains.append(self._gain(d, e_finite, scale_max, unit_norm))
        return {
            "max_devs": max_devs,
            "rms_devs": rms_devs,
            "gains": gains,
            "dof_rms": self._dof(),
            "systematic": [self._t(moments, e_finite) for moments in self.moments],
            "shift": self._shift(e_finite, scale_max),
        }

    def _gain(self, d: int, e_finite: bool, scale_max: float, unit_norm: float | None) -> float:
        if self.size == 0:
            return 0.0
        if not (e_finite and self.finite[d]):
            return math.nan
        if scale_max == 0.0:
            return 0.0 if self.max_value[d] == 0.0 else math.inf
        scale, inner = self.inner[d]
        return inner * (scale / scale_max) ** 2 / unit_norm

    def _dof(self) -> float:
        every = float(np.max(self.max_dev))
        if self.size == 0 or every == 0.0 or not math.isfinite(every):
            return 1.0
        scale, gram = self.gram
        gram = gram * (scale / every) ** 2
        distinct = ~np.eye(self.draws, dtype=bool)
        squared = np.diag(gram)
        trace_squared = float(np.sum(np.outer(squared, squared)[distinct]))
        trace_of_square = float(np.sum(np.square(gram)[distinct]))
        if trace_of_square <= 0.0:
            return float(self.size)
        return float(min(max(trace_squared / trace_of_square, 1.0), self.size))

    def _t(self, moments: _GroupMoments, e_finite: bool) -> float:
        if moments.mean is None or not (moments.finite and e_finite) or moments.count < 2:
            return math.nan
        standard_error = np.sqrt(moments.m2 / (moments.count - 1)) / math.sqrt(moments.count)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(
                standard_error > 0, np.abs(moments.mean) / standard_error, np.where(moments.mean == 0, 0.0, np.inf)
            )
        return float(t[int(np.argmax(t))])

    def _shift(self, e_finite: bool, scale_max: float) -> float:
        if self.shift.mean is None or not (self.shift.finite and e_finite):
            return math.nan
        return safe_ratio(float(np.max(np.abs(self.shift.mean))), scale_max)
