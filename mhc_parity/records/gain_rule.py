"""The gain's floor, shared by the judging's gain criterion and the gate's systematic-shift rule.

The gain ⟨d, o⟩ / ⟨o, o⟩ is a mean over the leaf: per-element errors d_i, independent and each
within f·max|o|, move it by a spread of at most f·max|o| / ‖o‖₂ (its variance is
Σ d_i² o_i² / ‖o‖₂⁴ ≤ f² max|o|² / ‖o‖₂²). So an element floor of f is the floor
f·(max|o| / ‖o‖₂) on the gain: f / √N_eff, not f, which would hide a coherent scale up to f.
Below the harness and the reports, which both read it (docs/judging.md, docs/gate.md).
"""

from __future__ import annotations

import math


def peak_to_l2(peak: float, l2: float) -> float:
    """max|o| / ‖o‖₂ of a leaf (1/√N_eff, in (0, 1]): 1 for an all-zero or one-element leaf,
    NaN when either is not finite. peak, l2: float64 magnitudes of the oracle's value."""
    if not (math.isfinite(peak) and math.isfinite(l2)):
        return math.nan
    return 1.0 if l2 == 0.0 else min(1.0, peak / l2)


def gain_floor(element_floor: float, peak_to_l2_: float) -> float:
    """An element floor (relative to max|o|) carried onto the gain's scale: element_floor ×
    max|o|/‖o‖₂. A leaf with no recorded ratio (NaN: rows written before the column) gets no
    floor at all, so stale input can only be judged more strictly, never passed by a floor."""
    if not math.isfinite(peak_to_l2_) or peak_to_l2_ < 0.0:
        return 0.0
    return float(element_floor) * float(peak_to_l2_)
