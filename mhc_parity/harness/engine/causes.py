"""A failing row's most likely cause: the operation's hypotheses (roundings its model does not allow)
run once through the float64 oracle on the case's fixture, then each failing candidate attributed
over all its leaves (`mhc_parity.harness.judging.attribution`), setting `cause`, `cause_id` and
`cause_explained`. A case without a failing row runs none of this."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import threading
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import fixture_elements
from mhc_parity.harness.engine.leaves import token_axes, weight_leaf
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.engine.oracle_path import leaves_as_draw, named_leaves, noise_units
from mhc_parity.harness.judging.attribution import (
    FITTED_KIND,
    SIZE_MATCHED_KINDS,
    Attribution,
    FittedHypothesis,
    HypothesisErrors,
    along,
    attribute_candidate,
    judged_statistics,
    scaled_errors,
    size_ranges,
    token_means,
)
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.harness.judging.error_statistics import l2_norm, upcast
from mhc_parity.harness.judging.held_precision import HeldDraw, ordered_sum_holding
from mhc_parity.records.cause_consistency import (
    HELD_IN_ANOTHER_ORDER,
    IN_ANOTHER_ORDER,
    NOT_ATTRIBUTED_ID,
    NOT_SEARCHED_ID,
    WITHIN_MODEL_ID,
)
from mhc_parity.records.text import format_number

# The largest case whose hypotheses run (fixture elements): every hypothesis holds all of a
# case's leaves in float64, so above this a failing row says why it names no cause.
MAX_ATTRIBUTED_ELEMENTS = 5_000_000
NOT_ATTRIBUTED = (
    "not attributed: the case's {elements:,} fixture elements are more than the hypotheses are run on ({limit:,})"
)
# A failing row's cause where the run skipped the search (`--no-causes`).
NOT_SEARCHED = "causes not searched (--no-causes)"
# Where a candidate fails against its partner but holds its own bound against the oracle.
WITHIN_MODEL = (
    "within its rounding model against the oracle (usage {usage}): the partner is closer than the bound allows"
)


# Scalings of a case's hypothesis errors `HypothesisOracle.in_units` keeps: the oracle's own,
# and one a path's declared precision choices widen (each holds every hypothesis' leaves).
KEPT_UNITS = 2


class HypothesisOracle:
    """Each case's hypotheses and their oracle leaves, the latest case's kept (every hypothesis holds all
    of a case's leaves). Called as (case, fixture) -> (hypotheses, per hypothesis a leaf -> float64 array
    mapping named like a path's leaves). Thread-safe; one object may serve every run of a case (the
    answers are the oracle's alone). fits: a `FitStore`, or None: every fit is solved."""

    def __init__(self, fits=None):
        self.fits = fits
        self._latest: tuple | None = None  # (case, answer)
        self._lock = threading.Lock()
        # The latest case's hypothesis errors in units (`in_units`): (id of the oracle
        # leaves, scales) -> (those leaves, the errors), the most recent last.
        self._units: collections.OrderedDict[tuple, tuple] = collections.OrderedDict()

    def __call__(self, case, fixture) -> tuple[Sequence, list[dict[str, np.ndarray]]]:
        """The case's drawn hypotheses (every kind but `FITTED_KIND`) and their leaves."""
        return self._answer(case, fixture)[:2]

    def fitted(self, case, fixture) -> list[tuple]:
        """The case's fitted hypotheses, each with the oracle's response to an error at its
        place (`Operation.hypothesis_responses`)."""
        return self._answer(case, fixture)[2]

    def _answer(self, case, fixture):
        with self._lock:
            if self._latest is not None and self._latest[0] == case:
                return self._latest[1]
        branch = get_branch(case.branch)
        every = OPERATION.hypotheses(case, branch, noise_units(case))
        drawn = [h for h in every if h.kind != FITTED_KIND]
        fitted = [h for h in every if h.kind == FITTED_KIND]
        draws = OPERATION.hypothesis_draws(case, fixture, branch, drawn)
        responses = OPERATION.hypothesis_responses(case, fixture, branch, fitted) if fitted else []
        answer = (drawn, [named_leaves(draw) for draw in draws], list(zip(fitted, responses)))
        with self._lock:
            if self._latest is None or self._latest[0] != case:
                self._units.clear()
            self._latest = (case, answer)
        return answer

    def fit_solutions(self, case, fixture, hypothesis, response, scales: Mapping[str, float]):
        """Where the solutions of a fitted `hypothesis` (its oracle `response`) on `case` in
        units of `scales` are kept (`FittedHypothesis.solutions`), or None without a store."""
        if self.fits is None:
            return None
        return self.fits.solutions(case, fixture, hypothesis.name, response.shape, scales)

    def in_units(self, case, fixture, oracle_leaves: Mapping[str, np.ndarray], scales: Mapping[str, float]) -> list:
        """The drawn hypotheses' errors against `oracle_leaves` in units of `scales` (leaf -> σ),
        with their size ranges (`HypothesisErrors`, in `__call__`'s order): what a candidate's
        errors are matched against. Computed once per case, oracle answer (the same object)
        and scales, for the last `KEPT_UNITS` of them."""
        chosen, hypothesis_leaves = self._answer(case, fixture)[:2]
        key = (id(oracle_leaves), tuple(sorted(scales.items())))
        with self._lock:
            kept = self._units.get(key)
            if kept is not None and kept[0] is oracle_leaves and self._latest[0] == case:
                self._units.move_to_end(key)
                return kept[1]
        errors = size_ranges(
            [
                HypothesisErrors(
                    h.name,
                    h.label,
                    h.family,
                    scaled_errors(_errors(leaves, oracle_leaves), scales),
                    by_size=h.kind in SIZE_MATCHED_KINDS,
                    variant_of=h.variant_of,
                )
                for h, leaves in zip(chosen, hypothesis_leaves)
            ]
        )
        with self._lock:
            if self._latest is not None and self._latest[0] == case:
                # The leaves are held with the errors, so their id names no other object meanwhile.
                self._units[key] = (oracle_leaves, errors)
                while len(self._units) > KEPT_UNITS:
                    self._units.popitem(last=False)
        return errors


def fitted_in_units(hypothesis, response, scales: Mapping[str, float], solutions=None) -> FittedHypothesis:
    """A fitted hypothesis' response with every leaf in units of its σ (`scales`); solutions:
    where its fits' solutions are kept (`HypothesisOracle.fit_solutions`)."""

    def apply(p):
        return scaled_errors(named_leaves(response.apply(p)), scales)

    def transpose(z):
        return response.transpose(leaves_as_draw({leaf: v / scales[leaf] for leaf, v in z.items()}))

    return FittedHypothesis(
        hypothesis.name, hypothesis.label, hypothesis.family, response.shape, apply, transpose, solutions
    )


def _needs_cause(row: dict, candidate_leaves: Mapping[str, Mapping], oracle_leaves: Mapping) -> bool:
    leaves = candidate_leaves.get(row["candidate"])
    return row["verdict"] == "fail" and leaves is not None and row["leaf"] in leaves and row["leaf"] in oracle_leaves


def rows_needing_causes(
    rows: Sequence[dict], candidate_leaves: Mapping[str, Mapping], oracle_leaves: Mapping
) -> list[int]:
    """The indices of the rows `annotate_causes` names a cause for: failing rows that compared leaves."""
    return [i for i, row in enumerate(rows) if _needs_cause(row, candidate_leaves, oracle_leaves)]


def not_searched(rows: Sequence[dict], candidate_leaves: Mapping[str, Mapping], oracle_leaves: Mapping) -> list[dict]:
    """`rows` with every row `annotate_causes` would name a cause for saying none was searched
    (`--no-causes`): the verdicts are the same, the hypotheses never run."""
    rows = list(rows)
    for i in rows_needing_causes(rows, candidate_leaves, oracle_leaves):
        rows[i] = {**rows[i], "cause": NOT_SEARCHED, "cause_id": NOT_SEARCHED_ID, "cause_explained": float("nan")}
    return rows


def _errors(leaves: Mapping[str, np.ndarray], oracle_leaves: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """leaf -> leaves[leaf] − oracle (float64), for the leaves the oracle has."""
    return {leaf: upcast(value) - oracle_leaves[leaf] for leaf, value in leaves.items() if leaf in oracle_leaves}


def leaf_scales(oracle_leaves: Mapping[str, np.ndarray], sensitivity: Mapping[str, Sensitivity]) -> dict[str, float]:
    """leaf -> σ, the rounding model's RMS deviation of the leaf in absolute units (its
    sensitivity's relative RMS times ‖oracle‖₂), where it is positive and finite."""
    scales = {}
    for leaf, exact in oracle_leaves.items():
        s = sensitivity.get(leaf)
        value = float("nan") if s is None else s.rms * l2_norm(upcast(exact))
        if np.isfinite(value) and value > 0.0:
            scales[leaf] = value
    return scales


def annotate_causes(
    rows: Sequence[dict],
    case,
    fixture,
    *,
    oracle_leaves: Mapping[str, np.ndarray],
    oracle_sensitivity: Mapping[str, Sensitivity],
    candidate_leaves: Mapping[str, Mapping[str, np.ndarray]],
    hypotheses: HypothesisOracle,
    candidate_sensitivity: Mapping[str, Mapping[str, Sensitivity]] | None = None,
    elsewhere: Collection[str] = (),
) -> list[dict]:
    """`rows` (one case's) with `cause`, `cause_id` and `cause_explained` set on every failing row that
    compared leaves. candidate_leaves: path name -> its leaves; each candidate is attributed over all
    its leaves in units of its own sensitivity (the oracle's, or its `candidate_sensitivity` where
    declared precision choices widen it). elsewhere: the candidates that ran on another backend than the
    hypotheses' draws (the host), whose narrow sums are matched by size only (`off_backend_errors`)."""
    rows = list(rows)
    failing = rows_needing_causes(rows, candidate_leaves, oracle_leaves)
    if not failing:
        return rows
    elements = fixture_elements(case)
    if elements > MAX_ATTRIBUTED_ELEMENTS:
        cause = NOT_ATTRIBUTED.format(elements=elements, limit=MAX_ATTRIBUTED_ELEMENTS)
        for i in failing:
            rows[i] = {**rows[i], "cause": cause, "cause_id": NOT_ATTRIBUTED_ID, "cause_explained": float("nan")}
        return rows
    chosen, hypothesis_leaves = hypotheses(case, fixture)

    def in_units(scales):
        return hypotheses.in_units(case, fixture, oracle_leaves, scales)

    fitted = hypotheses.fitted(case, fixture)
    model_scales = leaf_scales(oracle_leaves, oracle_sensitivity)
    model_errors = in_units(model_scales)

    @functools.cache
    def in_units_of(candidate: str):
        """A path's errors, the hypotheses' and the fitted ones, in units of its own σ (once per
        path: a within-model row asks again for its partner)."""
        widened = (candidate_sensitivity or {}).get(candidate)
        scales = model_scales if widened is None else leaf_scales(oracle_leaves, widened)
        errors_of = model_errors if widened is None else in_units(scales)
        if candidate in elsewhere:
            errors_of = off_backend_errors(errors_of, chosen, case.tokens)
        errors = scaled_errors(_errors(candidate_leaves[candidate], oracle_leaves), scales)
        fits = [
            fitted_in_units(h, response, scales, hypotheses.fit_solutions(case, fixture, h, response, scales))
            for h, response in fitted
        ]
        return errors, errors_of, fits

    own_rows = {(r["candidate"], r["leaf"]): r for r in rows if r["comparison"] == "vs_oracle"}

    def attribute(candidate: str, leaves: Sequence[str]) -> dict[str, Attribution]:
        """The causes of a path's `leaves`; a leaf its own row fails on the gain alone
        (`GAIN_METRIC`) is matched along the leaf, one failing on the systematic criterion alone
        (`SYSTEMATIC_METRICS`) on its token means (`judged_statistics`)."""
        errors, errors_of, fits = in_units_of(candidate)
        views = {}
        for leaf in leaves:
            own = own_rows.get((candidate, leaf))
            if own is None or own["verdict"] != "fail" or leaf not in errors:
                continue
            exact = np.asarray(upcast(oracle_leaves[leaf]))  # in the leaf's shape, which a view keeps
            if np.size(errors[leaf]) != exact.size:
                continue
            if own.get("bound_metric") == GAIN_METRIC:
                norm = l2_norm(np.ravel(exact))  # summed flat, in one fixed order
                if np.isfinite(norm) and norm > 0.0:
                    views[leaf] = along(exact / norm)
            elif own.get("bound_metric") in SYSTEMATIC_METRICS and token_axes(leaf):
                views[leaf] = token_means(exact.shape, token_axes(leaf))
        errors, errors_of, fits = judged_statistics(errors, errors_of, fits, views)
        return attribute_candidate(errors, errors_of, list(leaves), fits)

    ordered = {h.name for h in chosen if h.ordered}
    labels = {h.name: h.label for h in chosen}
    draws = [HeldDraw(h.name, h.ordered, leaves) for h, leaves in zip(chosen, hypothesis_leaves)]
    found: dict[tuple[str, str], Attribution] = {}
    for candidate in dict.fromkeys(rows[i]["candidate"] for i in failing):
        failing_leaves = dict.fromkeys(rows[i]["leaf"] for i in failing if rows[i]["candidate"] == candidate)
        found.update({(candidate, leaf): a for leaf, a in attribute(candidate, failing_leaves).items()})
    for i in failing:
        row = rows[i]
        key = (row["candidate"], row["leaf"])
        fields = found[key].as_row_fields()
        own = own_rows.get(key)
        if not found[key].is_rounding and own is not None and own["verdict"] == "pass":
            fields.update(cause=WITHIN_MODEL.format(usage=format_number(own["bound_usage"])), cause_id=WITHIN_MODEL_ID)
            fields = (
                _ordered_sum_of_partner(row, candidate_leaves, ordered, attribute)
                or _held_sum_of_pair(row, candidate_leaves, oracle_leaves, draws, labels)
                or fields
            )
        rows[i] = {**row, **fields}
    return rows


# The metric of a row that fails on its gain alone, and those of one that fails on the systematic
# criterion alone (`mhc_parity.harness.judging.bounds`).
GAIN_METRIC = "cand_oracle_gain"
SYSTEMATIC_METRICS = frozenset({"cand_systematic_t", "cand_systematic_shift"})


def off_backend_errors(errors_of: Sequence[HypothesisErrors], chosen: Sequence, tokens: int) -> list[HypothesisErrors]:
    """The hypotheses' errors (`in_units`, in `chosen`'s order) as a candidate on another backend than the
    draws' is matched against: the weight gradients each sums narrowly (`backend_sum_weights`) matched by
    size only, since that backend sums in its own order. An ordered sum's host draw is the largest it
    may be; a cast's error may grow as √`tokens` in a narrow order (XLA:TPU folds the cast into the
    reduce: docs/accelerators.md). Matched value for value, the host's prediction would disqualify the
    rounding that caused the rest."""
    found = []
    for errors, hypothesis in zip(errors_of, chosen):
        leaves = [weight_leaf(w) for w in hypothesis.backend_sum_weights]
        if leaves:
            growth = 1.0 if hypothesis.ordered else math.sqrt(tokens)
            errors = dataclasses.replace(errors, sized={leaf: growth for leaf in leaves if leaf in errors.errors})
        found.append(errors)
    return found


def _ordered_sum_of_partner(row: dict, candidate_leaves, ordered: set[str], attribute) -> dict | None:
    """The cause of a row between two paths that each lie within their own model (its partner
    another path that ran): a sum whose value depends on its order (`ordered` hypotheses) that
    explains the partner's leaf value for value makes the two differ, each summing in its own
    order (a sharded path sums its shards apart). The row's cause fields, or None where the
    partner's leaf names no such sum. attribute(path, leaves): leaf -> `Attribution`."""
    partner = _path_partner(row, candidate_leaves)
    if partner is None:
        return None
    on_partner = attribute(partner, [row["leaf"]])[row["leaf"]]
    if not (on_partner.names and set(on_partner.names) <= ordered):
        return None
    return {**on_partner.as_row_fields(), "cause": on_partner.cause + IN_ANOTHER_ORDER.format(partner=partner)}


def _held_sum_of_pair(row: dict, candidate_leaves, oracle_leaves, draws, labels: Mapping[str, str]) -> dict | None:
    """The cause of a row between two paths that each lie within their own model, where both
    hold its leaf in a narrow dtype the model does not allow and one order-dependent hypothesis
    holds it there (`mhc_parity.harness.judging.held_precision.ordered_sum_holding`): the two differ by the
    order of that narrow sum. No share of the error is claimed (`cause_explained` NaN): the
    evidence is the dtype, not the values. None where that does not hold."""
    partner = _path_partner(row, candidate_leaves)
    if partner is None:
        return None
    pair = [candidate_leaves[row["candidate"]], candidate_leaves[partner]]
    found = ordered_sum_holding(row["leaf"], pair, oracle_leaves, draws)
    if found is None:
        return None
    name, dtype = found
    cause = labels[name] + HELD_IN_ANOTHER_ORDER.format(partner=partner, dtype=dtype)
    return {"cause": cause, "cause_id": name, "cause_explained": float("nan")}


def _path_partner(row: dict, candidate_leaves) -> str | None:
    """The row's partner where it is another path that ran (not the oracle, not the row's own)."""
    partner = str(row.get("partner", ""))
    return partner if partner in candidate_leaves and partner != row["candidate"] else None
