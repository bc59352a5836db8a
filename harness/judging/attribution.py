"""Which hypothesis explains a leaf's error: the numbers of a failing row's cause.

A hypothesis (a rounding the model does not allow, run through the float64 oracle) has an
error e_h = hypothesis − oracle, value for value. The candidate's error e_c = candidate −
oracle is explained by it to the fraction

    explained(e_c, e_h) = 1 − ‖e_c − e_h‖² / ‖e_c‖²

(1: the same error; 0: no better than no error at all; negative: worse). The candidate's
own legitimate rounding is in e_c too, so a failing row's bug explains at least
1 − (noise / error)², which its bound keeps near 1. A fraction below `EXPLAINED_THRESHOLD`
names no rounding: the error is a logic error's, or a rounding outside the hypotheses.
Pairs of hypotheses add to first order, so where one is not enough the best pair of the
leading few is tried. docs/judging.md says why the thresholds are where they are.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from harness.judging.error_statistics import l2_norm, upcast
from records.schema import UNEXPLAINED_CAUSE

# Below this fraction no hypothesis is named: half the squared error is not a rounding's.
EXPLAINED_THRESHOLD = 0.5
# A pair is named only where the best single hypothesis leaves this much unexplained and
# the pair explains `PAIR_GAIN` more: otherwise one cause is the simpler answer.
PAIR_BELOW = 0.9
PAIR_GAIN = 0.1
# Pairs are tried among the best few single hypotheses only (pairs of weak ones explain nothing).
PAIR_CANDIDATES = 4
# Hypotheses within this much of the best one explain a leaf equally well; the one the
# caller prefers (the cause of the candidate's other failing leaves) is named, so one bug
# gets one name across its leaves.
TIE = 0.02
UNEXPLAINED = "not explained by any rounding: look for a logic error"
UNEXPLAINED_ID = UNEXPLAINED_CAUSE


@dataclasses.dataclass(frozen=True)
class Attribution:
    """The most likely cause of one leaf's error.

    cause: the hypothesis' words (two joined by " + " for a pair), or `UNEXPLAINED`;
    explained: the fraction of the squared error it explains (for `UNEXPLAINED`, the best
    hypothesis' fraction, which fell below the threshold); names: the hypotheses' names
    (() when unexplained); best: the best hypothesis' words even when unexplained.
    """

    cause: str
    explained: float
    names: tuple[str, ...] = ()
    best: str = ""

    @property
    def is_rounding(self) -> bool:
        return bool(self.names)

    @property
    def cause_id(self) -> str:
        """The hypotheses' names joined by "+", or `UNEXPLAINED_ID`."""
        return "+".join(self.names) or UNEXPLAINED_ID

    def as_row_fields(self) -> dict:
        return {"cause": self.cause, "cause_id": self.cause_id, "cause_explained": self.explained}


def explained_fraction(candidate_error: np.ndarray, hypothesis_error: np.ndarray) -> float:
    """1 − ‖e_c − e_h‖² / ‖e_c‖² (float64; NaN where the candidate has no error or a NaN)."""
    e_c, e_h = upcast(candidate_error), upcast(hypothesis_error)
    total = l2_norm(e_c)
    if not np.isfinite(total) or total == 0.0:
        return float("nan")
    return 1.0 - (l2_norm(e_c - e_h) / total) ** 2


def explained_fractions(
    candidate_error: np.ndarray, hypothesis_errors: Mapping[str, tuple[str, np.ndarray]]
) -> dict[str, float]:
    """name -> `explained_fraction` of each hypothesis (hypothesis_errors: name -> (words, error))."""
    return {name: explained_fraction(candidate_error, error) for name, (_, error) in hypothesis_errors.items()}


def consensus(fractions_per_leaf: Sequence[Mapping[str, float]]) -> list[str]:
    """Hypothesis names, the one that explains most over several leaves first (the sum of each
    leaf's fraction clipped to [0, 1]; ties keep the first leaf's listed order)."""
    totals: dict[str, float] = {}
    for fractions in fractions_per_leaf:
        for name, fraction in fractions.items():
            totals[name] = totals.get(name, 0.0) + (min(max(fraction, 0.0), 1.0) if np.isfinite(fraction) else 0.0)
    return sorted(totals, key=lambda name: -totals[name])


def attribute_leaf(
    candidate_error: np.ndarray,
    hypothesis_errors: Mapping[str, tuple[str, np.ndarray]],
    *,
    fractions: Mapping[str, float] | None = None,
    preferred: Sequence[str] = (),
) -> Attribution:
    """The hypothesis (or pair) that explains most of `candidate_error`.

    candidate_error: candidate − oracle for one leaf, any shape; hypothesis_errors: name ->
    (words, hypothesis − oracle of the same shape); fractions: their `explained_fractions`
    if the caller has them; preferred: names in the order to choose among hypotheses within
    `TIE` of the best (then the listed order).
    """
    if fractions is None:
        fractions = explained_fractions(candidate_error, hypothesis_errors)
    rank = {name: i for i, name in enumerate(preferred)}
    listed = {name: i for i, name in enumerate(hypothesis_errors)}
    finite = [(f, name) for name, f in fractions.items() if np.isfinite(f)]
    scored = sorted(finite, key=lambda item: (-item[0], listed[item[1]]))
    if not scored:
        return Attribution(UNEXPLAINED, float("nan"))
    top = scored[0][0]
    tied = [name for f, name in scored if f >= top - TIE]
    name = min(tied, key=lambda n: (rank.get(n, len(rank)), listed[n]))
    fraction, words = fractions[name], hypothesis_errors[name][0]
    best = Attribution(words, fraction, (name,), words)
    if fraction < PAIR_BELOW:
        leading = [n for _, n in scored[:PAIR_CANDIDATES]]
        for n1, n2 in itertools.combinations(leading, 2):
            summed = upcast(hypothesis_errors[n1][1]) + upcast(hypothesis_errors[n2][1])
            pair = explained_fraction(candidate_error, summed)
            if pair >= best.explained + PAIR_GAIN:
                words_pair = f"{hypothesis_errors[n1][0]} + {hypothesis_errors[n2][0]}"
                best = Attribution(words_pair, pair, (n1, n2), words)
    if best.explained < EXPLAINED_THRESHOLD:
        return Attribution(UNEXPLAINED, best.explained, (), words)
    return best
