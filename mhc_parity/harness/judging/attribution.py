"""Which rounding hypothesis explains a failing candidate's errors (the row's `cause`).

Each leaf's error is scored against each hypothesis' error in units of the leaf's sensitivity σ, penalised
by what it makes worse on the passing leaves; docs/judging.md ("Why a row failed") gives the scores, the
by-size and fitted hypotheses and why the thresholds are where they are.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from mhc_parity.harness.judging.error_statistics import upcast
from mhc_parity.records.cause_consistency import UNEXPLAINED_WORDS, hypothesis_place
from mhc_parity.records.schema import UNEXPLAINED_CAUSE

# Below this fraction no hypothesis is named: half the squared error is not a rounding's.
EXPLAINED_THRESHOLD = 0.5
# A pair is named only where the best single hypothesis leaves this much unexplained and
# the pair explains `PAIR_GAIN` more.
PAIR_BELOW = 0.9
PAIR_GAIN = 0.1
PAIR_CANDIDATES = 4
# Hypotheses within this much of the best explain a leaf equally well; the caller's preferred
# one is named, so one bug gets one name across its leaves.
TIE = 0.02
UNEXPLAINED = UNEXPLAINED_WORDS
BY_SIZE = " (matched by the size of its error)"
UNEXPLAINED_ID = UNEXPLAINED_CAUSE
SIZE_MATCHED_KINDS = frozenset({"accumulation"})
# One leaf's size (a four-number bias gradient) is matched by one of the sums by chance.
MIN_SIZE_LEAVES = 2
FITTED_KIND = "fitted"
# Unexplained numbers per free number of a fit needed to try it: with more freedom than
# evidence it "explains" a lone leaf.
FIT_EVIDENCE = 4
# CGLS steps at most, and the share of the squared error a step must remove to go on.
FIT_STEPS = 40
FIT_PROGRESS = 1e-4
# A passing leaf contradicts a hypothesis that misses its error by more than this many times
# its own squared error (or σ²).
CONTRADICTS = 9.0
# The largest per-token relative error a narrow dtype's RMS statistic has: a fit's |p| past it
# is no rounding's size.
FIT_MAX_RELATIVE = 2.0**-4


@dataclasses.dataclass(frozen=True)
class Attribution:
    """The most likely cause of one leaf's error.

    cause: the hypothesis' words (a pair joined by " + "), or `UNEXPLAINED`; explained: the fraction of the
    squared error it explains (when unexplained, the best hypothesis' fraction); names: the hypotheses'
    names (() when unexplained); best: the best hypothesis' words even when unexplained.
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
        return "+".join(self.names) or UNEXPLAINED_ID

    def as_row_fields(self) -> dict:
        return {"cause": self.cause, "cause_id": self.cause_id, "cause_explained": self.explained}


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """⟨a, b⟩ in float64 by NumPy's own loop, not BLAS: the same bits on every machine."""
    return float(np.einsum("i,i->", a.ravel(), b.ravel()))


def scaled_errors(errors: Mapping[str, np.ndarray], scales: Mapping[str, float]) -> dict[str, np.ndarray]:
    """leaf -> error / σ (float64), for the leaves with a positive σ and a finite error."""
    scaled = {}
    for leaf, error in errors.items():
        scale = scales.get(leaf, 0.0)
        if scale > 0.0:
            value = upcast(error) / scale
            if np.all(np.isfinite(value)):
                scaled[leaf] = value
    return scaled


@dataclasses.dataclass(frozen=True)
class HypothesisErrors:
    """One hypothesis' errors against the oracle, leaf -> z_h (float64, in units of σ).

    family: hypotheses of one family round the same place and are never paired; by_size: matched by the size
    of its error only; scale_range: the factors its size may be off by (`size_ranges`); variant_of: the
    hypothesis whose forward errors it has; sized: leaf -> G, leaves whose error it bounds by G times its
    own without predicting their values.
    """

    name: str
    words: str
    family: str
    errors: Mapping[str, np.ndarray]
    by_size: bool = False
    scale_range: tuple[float, float] = (1.0, 1.0)
    variant_of: str = ""
    sized: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def norms(self) -> dict[str, float]:
        return {leaf: _dot(z, z) for leaf, z in self.errors.items()}


def size_ranges(hypotheses: Sequence[HypothesisErrors]) -> list[HypothesisErrors]:
    """`hypotheses` with each by-size one's `scale_range` spanning its family's sizes: one family is one sum
    in different orders, and a backend's order lies anywhere between."""
    totals = {h.name: sum(h.norms.values()) for h in hypotheses if h.by_size}
    family_totals: dict[str, list[float]] = {}
    for h in hypotheses:
        if h.by_size and totals[h.name] > 0:
            family_totals.setdefault(h.family, []).append(totals[h.name])
    ranged = []
    for h in hypotheses:
        known = family_totals.get(h.family) if h.by_size else None
        if known and totals[h.name] > 0:
            low, high = np.sqrt(min(known) / totals[h.name]), np.sqrt(max(known) / totals[h.name])
            h = dataclasses.replace(h, scale_range=(float(low), float(high)))
        ranged.append(h)
    return ranged


@dataclasses.dataclass(frozen=True)
class FittedHypothesis:
    """An error of any size per token at one place: apply(p) -> leaf -> first-order change in units of σ for
    the place's error p (float64, `shape`); transpose is its adjoint. solutions: the fit store
    (`mhc_parity.harness.engine.fit_store`) or None."""

    name: str
    words: str
    family: str
    shape: tuple[int, ...]
    apply: Callable[[np.ndarray], Mapping[str, np.ndarray]]
    transpose: Callable[[Mapping[str, np.ndarray]], np.ndarray]
    solutions: object | None = dataclasses.field(default=None, compare=False)


def fitted_errors(h: FittedHypothesis, candidate_errors: Mapping[str, np.ndarray]) -> HypothesisErrors | None:
    """h's errors at the p that best explains `candidate_errors` (CGLS over every leaf both have); None
    where any token's |p| exceeds `FIT_MAX_RELATIVE`, larger than a rounding makes."""
    solved = h.solutions.get(candidate_errors) if h.solutions is not None else None
    if solved is None:
        p, leaves = _solve(h, candidate_errors)
        if h.solutions is not None:
            h.solutions.put(candidate_errors, p, leaves)
    else:
        p, leaves = solved
    if not np.max(np.abs(p), initial=0.0) <= FIT_MAX_RELATIVE:
        return None
    fitted = set(leaves)
    fit = {leaf: np.asarray(v, np.float64) for leaf, v in h.apply(p).items() if leaf in fitted}
    return HypothesisErrors(h.name, h.words, h.family, fit)


@dataclasses.dataclass(frozen=True)
class LeafView:
    """A failing criterion's statistic of a leaf as a projection with orthonormal rows: project(z) -> v and
    its adjoint expand(v) -> z (float64)."""

    project: Callable[[np.ndarray], np.ndarray]
    expand: Callable[[np.ndarray], np.ndarray]


def along(direction: np.ndarray) -> LeafView:
    """The error's component along a unit vector of the leaf's shape: what the gain criterion judges."""
    u, shape = np.ravel(direction), np.shape(direction)
    return LeafView(lambda z: np.array([_dot(np.asarray(z), u)]), lambda v: (float(v[0]) * u).reshape(shape))


def token_means(shape: tuple[int, ...], token_axes: int) -> LeafView:
    """The error summed over the `token_axes` leading axes, over √tokens: what the systematic criterion
    judges."""
    tokens = math.prod(shape[:token_axes])
    root = math.sqrt(tokens)
    return LeafView(
        lambda z: np.reshape(z, (tokens, -1)).sum(axis=0) / root,
        lambda v: np.broadcast_to(np.asarray(v) / root, (tokens, np.size(v))).reshape(shape),
    )


def judged_statistics(
    candidate_errors: Mapping[str, np.ndarray],
    hypotheses: Sequence[HypothesisErrors],
    fitted: Sequence[FittedHypothesis],
    views: Mapping[str, LeafView],
) -> tuple[dict[str, np.ndarray], list[HypothesisErrors], list[FittedHypothesis]]:
    """The candidate's and hypotheses' errors with each leaf of `views` reduced to the statistic its failing
    criterion judges (a gain, a shift every token shares: far below the leaf's rounding noise); other leaves
    are kept whole."""
    if not views:
        return dict(candidate_errors), list(hypotheses), list(fitted)

    def project(errors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {leaf: views[leaf].project(z) if leaf in views else z for leaf, z in errors.items()}

    def expand(z: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {leaf: views[leaf].expand(v) if leaf in views else v for leaf, v in z.items()}

    def fitted_on_views(h: FittedHypothesis) -> FittedHypothesis:
        return dataclasses.replace(
            h, apply=lambda p: project(h.apply(p)), transpose=lambda z: h.transpose(expand(z)), solutions=None
        )

    return (
        project(candidate_errors),
        [dataclasses.replace(h, errors=project(h.errors)) for h in hypotheses],
        [fitted_on_views(h) for h in fitted],
    )


def _solve(h: FittedHypothesis, candidate_errors: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[str]]:
    """`fitted_errors`' CGLS: (p, the leaves fitted over)."""
    p = np.zeros(h.shape, np.float64)
    leaves = [leaf for leaf in h.apply(p) if leaf in candidate_errors]
    residual = {leaf: np.array(candidate_errors[leaf], np.float64) for leaf in leaves}
    total = sum(_dot(z, z) for z in residual.values())
    gradient = h.transpose(residual)
    direction = gradient.copy()
    gamma = _dot(gradient, gradient)
    for _ in range(FIT_STEPS):
        if not (gamma > 0 and total > 0):
            break
        change = {leaf: v for leaf, v in h.apply(direction).items() if leaf in residual}
        curvature = sum(_dot(v, v) for v in change.values())
        if not curvature > 0:
            break
        alpha = gamma / curvature
        p += alpha * direction
        for leaf, v in change.items():
            residual[leaf] = residual[leaf] - alpha * v
        if alpha * gamma < FIT_PROGRESS * total:  # the step removed alpha·gamma of the squared error
            break
        gradient = h.transpose(residual)
        gamma, previous = _dot(gradient, gradient), gamma
        direction = gradient + (gamma / previous) * direction
    return p, leaves


class _Scores:
    """The sums the scores need, in units of σ: ‖z_c,l‖², ⟨z_c, z_h⟩ and ‖z_h‖² per (hypothesis, leaf)."""

    def __init__(self, candidate_errors, hypotheses, failing):
        self.leaves = [leaf for leaf in candidate_errors if all(leaf in h.errors for h in hypotheses)]
        self.hypotheses = {h.name: h for h in hypotheses}
        self.passing = [leaf for leaf in self.leaves if leaf not in set(failing)]
        z_c = {leaf: candidate_errors[leaf] for leaf in self.leaves}
        self.total = {leaf: _dot(z, z) for leaf, z in z_c.items()}
        self.cross = {(h.name, leaf): _dot(z_c[leaf], h.errors[leaf]) for h in hypotheses for leaf in self.leaves}
        self._excess: dict[tuple[str, ...], float] = {}

    def residual(self, names: Sequence[str], leaf: str) -> float:
        """‖z_c − Σ z_h‖² on one leaf for one or two hypotheses; for those that predict the leaf's size only
        (`HypothesisErrors.sized`), what the others leave less (Σ G‖z_h‖)²."""
        sized = [n for n in names if leaf in self.hypotheses[n].sized]
        if sized:
            valued = [n for n in names if n not in sized]
            left = self.residual(valued, leaf) if valued else self.total[leaf]
            allowed = sum(self.hypotheses[n].sized[leaf] * np.sqrt(self.hypotheses[n].norms[leaf]) for n in sized)
            return max(0.0, float(left - allowed**2))
        value = self.total[leaf] - 2 * sum(self.cross[(n, leaf)] for n in names)
        value += sum(self.hypotheses[n].norms[leaf] for n in names)
        if len(names) == 2:
            a, b = (self.hypotheses[n].errors[leaf] for n in names)
            value += 2 * _dot(a, b)
        return value

    def excess(self, names: Sequence[str]) -> float:
        """What the hypotheses make worse on the passing leaves than predicting no error."""
        key = tuple(names)
        if key not in self._excess:
            self._excess[key] = max(0.0, sum(self.residual(names, p) - self.total[p] for p in self.passing))
        return self._excess[key]

    def contradicted(self, names: Sequence[str]) -> bool:
        return any(_contradicts(self.residual(names, p), self.total[p]) for p in self.passing)

    def score(self, names: Sequence[str], leaf: str) -> float:
        total = self.total[leaf]
        if not total > 0 or self.contradicted(names):
            return float("nan")
        return 1.0 - (self.residual(names, leaf) + self.excess(names)) / total


def _contradicts(residual: float, total: float) -> bool:
    return residual > CONTRADICTS * max(total, 1.0)


def attribute_candidate(
    candidate_errors: Mapping[str, np.ndarray],
    hypotheses: Sequence[HypothesisErrors],
    failing: Sequence[str],
    fitted: Sequence[FittedHypothesis] = (),
) -> dict[str, Attribution]:
    """The most likely cause of each failing leaf of one candidate: leaf -> `Attribution`.

    candidate_errors: leaf -> (candidate − oracle) / σ for every leaf, passing ones too (`scaled_errors`);
    hypotheses and fitted: in the same units (a leaf some lack takes no part). Matched value for value
    first, then by the fitted hypotheses, then by size.
    """
    valued = [h for h in hypotheses if not h.by_size]
    by_values = _attribute_by_values(candidate_errors, valued, failing)
    unexplained = [leaf for leaf in failing if not by_values[leaf].is_rounding]
    for h in fitted if unexplained else ():
        evidence = sum(np.size(candidate_errors[leaf]) for leaf in unexplained if leaf in candidate_errors)
        if evidence < FIT_EVIDENCE * math.prod(h.shape):
            continue
        fit = fitted_errors(h, candidate_errors)
        if fit is None or _joint_fraction(candidate_errors, fit, unexplained, failing) < EXPLAINED_THRESHOLD:
            continue  # it matches some leaves' values, not the error: the bug is elsewhere
        valued.append(fit)
        by_fit = _attribute_by_values(candidate_errors, [fit], failing)
        by_values = {**by_values, **{leaf: by_fit[leaf] for leaf in unexplained if by_fit[leaf].is_rounding}}
        unexplained = [leaf for leaf in unexplained if not by_values[leaf].is_rounding]
    by_values = _at_one_place(candidate_errors, valued, failing, by_values)
    unexplained = [leaf for leaf in failing if not by_values[leaf].is_rounding]
    sized = [h for h in hypotheses if h.by_size]
    if not (unexplained and sized):
        return by_values
    leaves = [leaf for leaf in candidate_errors if all(leaf in h.errors for h in sized)]
    sizes = {leaf: _dot(candidate_errors[leaf], candidate_errors[leaf]) for leaf in leaves}
    targets = [leaf for leaf in unexplained if leaf in sizes]
    passing = [leaf for leaf in leaves if leaf not in set(failing)]
    if len(targets) < MIN_SIZE_LEAVES or not sum(sizes[leaf] for leaf in targets) > 0:
        return by_values
    joint = {h.name: _size_score(h, sizes, targets, passing) for h in sized}
    best = max(sized, key=lambda h: joint[h.name])  # the first of equals: max keeps it
    if joint[best.name] < EXPLAINED_THRESHOLD:
        return by_values
    found = dict(by_values)
    for leaf in targets:
        found[leaf] = Attribution(best.words + BY_SIZE, joint[best.name], (best.name,), best.words)
    return found


def _at_one_place(
    candidate_errors: Mapping[str, np.ndarray],
    hypotheses: Sequence[HypothesisErrors],
    failing: Sequence[str],
    found: Mapping[str, Attribution],
) -> dict[str, Attribution]:
    """`found` with each failing leaf named at the place most of them name, where that place's best
    hypothesis explains at least `EXPLAINED_THRESHOLD` of it: one bug is at one place."""
    places = collections.Counter(
        place for a in found.values() for place in dict.fromkeys(hypothesis_place(n) for n in a.names)
    )
    if not places:
        return dict(found)
    place = places.most_common(1)[0][0]
    there = [h for h in hypotheses if hypothesis_place(h.name) == place]
    sums = _Scores(candidate_errors, there, failing)
    revised = dict(found)
    for leaf, a in found.items():
        if leaf not in sums.total or (a.names and all(hypothesis_place(n) == place for n in a.names)):
            continue
        scores = {h.name: sums.score((h.name,), leaf) for h in there}
        scores = {n: v for n, v in scores.items() if np.isfinite(v)}
        if scores and max(scores.values()) >= EXPLAINED_THRESHOLD:
            name = max(scores, key=scores.get)
            words = sums.hypotheses[name].words + (BY_SIZE if leaf in sums.hypotheses[name].sized else "")
            revised[leaf] = Attribution(words, scores[name], (name,), words)
    return revised


def _joint_fraction(
    candidate_errors: Mapping[str, np.ndarray], h: HypothesisErrors, targets: Sequence[str], failing: Sequence[str]
) -> float:
    """Mean over `targets` of the clipped fraction h explains of each leaf: each leaf counts once, as in
    units of σ a bias gradient's squared error outweighs the whole output's."""
    sums = _Scores(candidate_errors, [h], failing)
    scores = [sums.score((h.name,), leaf) for leaf in targets if leaf in sums.total]
    scores = [min(max(s, 0.0), 1.0) for s in scores if np.isfinite(s)]
    return float(np.mean(scores)) if scores else 0.0


def _size_score(h: HypothesisErrors, sizes: Mapping[str, float], targets: Sequence[str], passing: Sequence[str]):
    """The joint size score of `h` on `targets`, scaled by the factor in `h.scale_range` that fits best;
    sizes: leaf -> ‖z_c‖²."""
    root_t = {leaf: np.sqrt(sizes[leaf]) for leaf in sizes}
    root_h = {leaf: np.sqrt(h.norms[leaf]) for leaf in sizes}
    across = sum(h.norms[leaf] for leaf in targets)
    fit = sum(root_t[leaf] * root_h[leaf] for leaf in targets) / across if across > 0 else 1.0
    scale = min(max(fit, h.scale_range[0]), h.scale_range[1])

    def residual(leaf):
        return (root_t[leaf] - scale * root_h[leaf]) ** 2

    if any(_contradicts(residual(p), sizes[p]) for p in passing):
        return float("-inf")
    excess = max(0.0, sum(residual(p) - sizes[p] for p in passing))
    return 1.0 - (sum(residual(leaf) for leaf in targets) + excess) / sum(sizes[leaf] for leaf in targets)


def _plain_forms(sums: _Scores, targets: Sequence[str]) -> dict[str, str]:
    """variant -> its plain form, for variants no failing leaf tells from it (residuals within `TIE`) and
    whose plain form no passing leaf contradicts."""
    found = {}
    for name, h in sums.hypotheses.items():
        base = h.variant_of
        if base not in sums.hypotheses or sums.contradicted((base,)):
            continue
        if all(
            abs(sums.residual((base,), leaf) - sums.residual((name,), leaf)) <= TIE * sums.total[leaf]
            for leaf in targets
        ):
            found[name] = base
    return found


def _attribute_by_values(
    candidate_errors: Mapping[str, np.ndarray], hypotheses: Sequence[HypothesisErrors], failing: Sequence[str]
) -> dict[str, Attribution]:
    """`attribute_candidate`'s choice value for value, with pairs. Within `TIE` of a leaf's best score, the
    hypothesis with the highest total over the failing leaves is named."""
    sums = _Scores(candidate_errors, hypotheses, failing)
    order = {h.name: i for i, h in enumerate(hypotheses)}
    targets = [leaf for leaf in failing if leaf in sums.total]
    scores = {leaf: {h.name: sums.score((h.name,), leaf) for h in hypotheses} for leaf in targets}
    totals = {
        h.name: sum(min(max(scores[leaf][h.name], 0.0), 1.0) for leaf in targets if np.isfinite(scores[leaf][h.name]))
        for h in hypotheses
    }
    plain = _plain_forms(sums, targets)
    found = {leaf: Attribution(UNEXPLAINED, float("nan")) for leaf in failing}
    for leaf in targets:
        ranked = sorted(
            (n for n in scores[leaf] if np.isfinite(scores[leaf][n])), key=lambda n: (-scores[leaf][n], order[n])
        )
        if not ranked:
            continue
        top = scores[leaf][ranked[0]]
        name = min((n for n in ranked if scores[leaf][n] >= top - TIE), key=lambda n: (-totals[n], order[n]))
        shown = plain.get(name, name)  # the variant's score, its plain form's name
        words = sums.hypotheses[shown].words + (BY_SIZE if leaf in sums.hypotheses[name].sized else "")
        best = Attribution(words, scores[leaf][name], (shown,), words)
        if best.explained < PAIR_BELOW:
            for n1, n2 in itertools.combinations(ranked[:PAIR_CANDIDATES], 2):
                if sums.hypotheses[n1].family == sums.hypotheses[n2].family:
                    continue  # rounding one place twice is rounding it once
                pair = sums.score((n1, n2), leaf)
                if pair >= best.explained + PAIR_GAIN:
                    best = Attribution(
                        f"{sums.hypotheses[n1].words} + {sums.hypotheses[n2].words}", pair, (n1, n2), words
                    )
        found[leaf] = (
            best if best.explained >= EXPLAINED_THRESHOLD else Attribution(UNEXPLAINED, best.explained, (), words)
        )
    return found
