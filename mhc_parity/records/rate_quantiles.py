"""A stated false-positive rate and the quantile q that holds to it, both ways: `quantile` for the bounds, `rate_of` for
the gate to read a run's stated rate back from its rows.
"""

from __future__ import annotations

import functools
import math


@functools.lru_cache(maxsize=4096)
def quantile(false_positive_rate: float, dof: float, draws: int) -> float:
    """q with P(‖e‖ > q·S) = false_positive_rate when ‖e‖² / S² ~ F(dof, draws·dof).

    dof: the leaf's effective degrees of freedom (clamped to >= 1); draws: how many draws S averages. NaN dof or draws
    (no sensitivity measured) give 1.0: the bound is then the rule's ratio alone.
    """
    if math.isnan(dof) or math.isnan(draws) or draws < 1:
        return 1.0
    if not 0.0 < false_positive_rate < 1.0:
        raise ValueError(f"a false-positive rate lies in (0, 1), got {false_positive_rate!r}")
    dof = max(float(dof), 1.0)
    # Imported here: scipy.special's import costs more than a warm run's judging (stored rows, no bound).
    from scipy import special

    return math.sqrt(float(special.fdtri(dof, draws * dof, 1.0 - false_positive_rate)))


def rate_of(q: float, dof: float, draws: float) -> float:
    """The p at which `quantile(p, dof, draws)` = q: P(F(dof, draws·dof) > q²), dof clamped to >= 1."""
    # Imported here, as in `quantile`: scipy.special's import is slow.
    from scipy import special

    dof = max(float(dof), 1.0)
    return float(special.fdtrc(dof, float(draws) * dof, float(q) ** 2))
