"""The gain's floor, shared by the judging's gain criterion and the gate's systematic-shift rule: an element floor f
moves the gain ⟨d, o⟩ / ⟨o, o⟩ by at most f·max|o| / ‖o‖₂ = f / √N_eff (derivation: docs/judging.md).
"""

from __future__ import annotations

import math


def peak_to_l2(peak: float, l2: float) -> float:
    """max|o| / ‖o‖₂ of a leaf, in (0, 1] (1 for an all-zero or one-element leaf, NaN if either input is not finite).
    peak, l2: float64 magnitudes of the oracle's value."""
    if not (math.isfinite(peak) and math.isfinite(l2)):
        return math.nan
    return 1.0 if l2 == 0.0 else min(1.0, peak / l2)


def gain_floor(element_floor: float, peak_to_l2_: float) -> float:
    """`element_floor` (relative to max|o|) on the gain's scale. A NaN ratio (rows written before the column) gets floor
    0: stale input is judged more strictly, never passed by a floor."""
    if not math.isfinite(peak_to_l2_) or peak_to_l2_ < 0.0:
        return 0.0
    return float(element_floor) * float(peak_to_l2_)
