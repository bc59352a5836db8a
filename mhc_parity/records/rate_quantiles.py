"""A stated false-positive rate and the quantile q that holds to it, both ways.

`quantile(p, k, N)`: q with P(‖e‖ > q·S) = p when ‖e‖² / S² ~ F(k, N·k)
(`mhc_parity.harness.judging.confidence` derives it; the bounds use it). `rate_of(q, k, N)`: the
p a q was computed at, read back, so the gate can take a run's own stated rate from its rows
(`mhc_parity.reports.gain_shift`). Below both the harness and the reports.
"""

from __future__ import annotations

import functools
import math


@functools.lru_cache(maxsize=4096)
def quantile(false_positive_rate: float, dof: float, draws: int) -> float:
    """q with P(‖e‖ > q·S) = false_positive_rate when ‖e‖² / S² ~ F(dof, draws·dof).

    dof: the leaf's effective degrees of freedom (>= 1); draws: how many draws S averages.
    NaN dof or draws (no sensitivity measured) give 1.0: the bound is then the rule's ratio
    alone, as without a stated rate.
    """
    if math.isnan(dof) or math.isnan(draws) or draws < 1:
        return 1.0
    if not 0.0 < false_positive_rate < 1.0:
        raise ValueError(f"a false-positive rate lies in (0, 1), got {false_positive_rate!r}")
    dof = max(float(dof), 1.0)
    # Imported here: scipy.special's import costs more than a warm run's judging, which loads
    # its judged rows (`mhc_parity.harness.stores.comparison_store`) and computes no bound.
    from scipy import special

    return math.sqrt(float(special.fdtri(dof, draws * dof, 1.0 - false_positive_rate)))


def rate_of(q: float, dof: float, draws: float) -> float:
    """The false-positive rate `quantile(p, dof, draws)` = q was computed at: P(F(dof, draws·dof) > q²),
    dof clamped to >= 1 as there."""
    # Imported here, as in `quantile`: scipy.special's import is slow.
    from scipy import special

    dof = max(float(dof), 1.0)
    return float(special.fdtrc(dof, float(draws) * dof, float(q) ** 2))
