"""A bound with a stated false-positive probability: the oracle's sensitivity and its quantile.

The rounding model's draws (`mhc_parity.harness.engine.oracle_path`) measure how far a correct
implementation's rounding may move a leaf; their root-mean-square is the sensitivity S. From
N draws S is itself an estimate, and a leaf whose error has few independent directions (a
bias gradient summed over every token has one) makes it a poor one: with 4 draws of a
one-direction leaf, S lands below a third of its true value about once in a hundred seeds.

So a bound does not multiply S alone. If a correct implementation's squared error behaves
like one more draw of the model (σ²·χ²_k / k, with k the leaf's effective degrees of
freedom) and S² averages N draws (σ²·χ²_{N·k} / (N·k)), then ‖e‖² / S² follows Fisher's
F(k, N·k), and

    P(‖e‖ > q·S) = p   for   q = sqrt(F⁻¹(1 − p; k, N·k)).

`quantile(p, k, N)` is that q. A small leaf with one direction gets a wide q (about 6 at
p = 1e-5 with 16 draws), a leaf of thousands of independent errors a q near 1. The
policy's `[confidence]` names p; a rule's `ratio` multiplies q·S by what the model cannot
know (accumulation orders it does not repeat), with its reason next to it.
docs/judging.md derives it; `make sweep` measures the tail.
"""

from __future__ import annotations

import dataclasses

# The F quantile lives below the harness and the reports, which both read it (the gate reads a
# run's rate back from its q: `mhc_parity.reports.gain_shift`).
from mhc_parity.records.rate_quantiles import quantile  # noqa: F401 - this module's public name


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    """How far the rounding model moves one leaf, over its draws.

    max, rms: root-mean-square over the draws of the max and RMS deviation from the exact
    oracle (normalised by max|oracle| and ‖oracle‖₂); gain: of the deviation's component
    along the leaf itself (`mhc_parity.harness.judging.error_statistics.gain`); dof_max, dof_rms: the
    effective degrees of freedom of the squared max and RMS deviations
    (`statistic_dof`, `effective_dof`); draws: N, how many draws they come from.
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
