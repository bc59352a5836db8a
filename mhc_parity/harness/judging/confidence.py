"""A bound with a stated false-positive probability: the oracle's sensitivity and its quantile.

From N draws the sensitivity S is itself an estimate, a poor one for a leaf of few error directions. If a
correct error's square behaves like one more draw (σ²·χ²_k / k) and S² averages N draws, then P(‖e‖ > q·S) =
p for q = sqrt(F⁻¹(1 − p; k, N·k)): `quantile(p, k, N)`. docs/judging.md derives it.
"""

from __future__ import annotations

import dataclasses

# The F quantile lives below the harness and the reports, which both read it.
from mhc_parity.records.rate_quantiles import quantile  # noqa: F401 - this module's public name


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    """How far the rounding model moves one leaf, over its draws.

    max, rms: RMS over the draws of the max and RMS deviation from the exact oracle (normalised by
    max|oracle| and ‖oracle‖₂); gain: of the deviation's component along the leaf; dof_max, dof_rms:
    effective degrees of freedom (`statistic_dof`, `effective_dof`); draws: N.
    """

    max: float
    rms: float
    gain: float
    dof_max: float
    dof_rms: float
    draws: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> Sensitivity:
        fields = {f.name for f in dataclasses.fields(cls)}
        if set(raw) != fields:
            raise ValueError(f"a sensitivity holds {sorted(fields)}, got {sorted(raw)}")
        return cls(**{k: (int(v) if k == "draws" else float(v)) for k, v in raw.items()})
