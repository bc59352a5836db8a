"""A failing row's most likely cause, from the operation's hypotheses run through the oracle.

For a case with a failing row, the operation's hypotheses (`Operation.hypotheses`: roundings
its model does not allow) run once through the float64 oracle on the case's fixture
(`Operation.hypothesis_draws`). Each failing (candidate, leaf) then gets the hypothesis whose
error against the oracle best matches the candidate's, on that leaf and without predicting an
error on the leaves the candidate got right (`harness.judging.attribution`), and the row its
`cause`, `cause_id` and `cause_explained`. A case without a failing row runs none of this.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from cases.branches import get_branch
from cases.fixtures import fixture_elements
from harness.engine.operation import OPERATION
from harness.engine.oracle_path import named_leaves, noise_units
from harness.judging.attribution import (
    SIZE_MATCHED_KINDS,
    Attribution,
    HypothesisErrors,
    attribute_candidate,
    scaled_errors,
    size_ranges,
)
from harness.judging.confidence import Sensitivity
from harness.judging.error_statistics import l2_norm, upcast
from records.text import format_number

# The largest case whose hypotheses run (fixture elements): every hypothesis holds all of a
# case's leaves in float64, so above this a failing row says why it names no cause.
MAX_ATTRIBUTED_ELEMENTS = 5_000_000
NOT_ATTRIBUTED_ID = "not_attributed"
NOT_ATTRIBUTED = (
    "not attributed: the case's {elements:,} fixture elements are more than the hypotheses are run on ({limit:,})"
)
# Where a candidate fails against its partner but holds its own bound against the oracle.
WITHIN_MODEL_ID = "within_model"
WITHIN_MODEL = (
    "within its rounding model against the oracle (usage {usage}): the partner is closer than the bound allows"
)


class HypothesisOracle:
    """Each case's hypotheses and their oracle leaves, the latest case's kept (a case's failing
    rows ask once per case; every hypothesis holds all the case's leaves, so no more are kept).

    Called as (case, fixture) -> (hypotheses, one leaf -> float64 array mapping per
    hypothesis, named like a path's leaves). Thread-safe.
    """

    def __init__(self):
        self._latest: tuple | None = None  # (case, answer)
        self._lock = threading.Lock()

    def __call__(self, case, fixture) -> tuple[Sequence, list[dict[str, np.ndarray]]]:
        with self._lock:
            if self._latest is not None and self._latest[0] == case:
                return self._latest[1]
        branch = get_branch(case.branch)
        hypotheses = OPERATION.hypotheses(case, branch, noise_units(case))
        draws = OPERATION.hypothesis_draws(case, fixture, branch, hypotheses)
        answer = (hypotheses, [named_leaves(draw) for draw in draws])
        with self._lock:
            self._latest = (case, answer)
        return answer


def _needs_cause(row: dict, candidate_leaves: Mapping[str, Mapping], oracle_leaves: Mapping) -> bool:
    leaves = candidate_leaves.get(row["candidate"])
    return row["verdict"] == "fail" and leaves is not None and row["leaf"] in leaves and row["leaf"] in oracle_leaves


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
) -> list[dict]:
    """`rows` (one case's) with `cause`, `cause_id` and `cause_explained` set on every failing
    row that compared leaves. candidate_leaves: path name -> its leaves (the paths that ran);
    each candidate is attributed over all its leaves (`attribute_candidate`), in units of its
    own sensitivity: the oracle's, or where `candidate_sensitivity` has one (a path whose
    declared precision choices widen its model), that."""
    rows = list(rows)
    failing = [i for i, row in enumerate(rows) if _needs_cause(row, candidate_leaves, oracle_leaves)]
    if not failing:
        return rows
    elements = fixture_elements(case)
    if elements > MAX_ATTRIBUTED_ELEMENTS:
        cause = NOT_ATTRIBUTED.format(elements=elements, limit=MAX_ATTRIBUTED_ELEMENTS)
        for i in failing:
            rows[i] = {**rows[i], "cause": cause, "cause_id": NOT_ATTRIBUTED_ID, "cause_explained": float("nan")}
        return rows
    chosen, hypothesis_leaves = hypotheses(case, fixture)
    deviations = [_errors(leaves, oracle_leaves) for leaves in hypothesis_leaves]

    def in_units(scales):
        return size_ranges(
            [
                HypothesisErrors(
                    h.name, h.label, h.family, scaled_errors(e, scales), by_size=h.kind in SIZE_MATCHED_KINDS
                )
                for h, e in zip(chosen, deviations)
            ]
        )

    model_scales = leaf_scales(oracle_leaves, oracle_sensitivity)
    model_errors = in_units(model_scales)
    found: dict[tuple[str, str], Attribution] = {}
    for candidate in dict.fromkeys(rows[i]["candidate"] for i in failing):
        widened = (candidate_sensitivity or {}).get(candidate)
        scales = model_scales if widened is None else leaf_scales(oracle_leaves, widened)
        errors_of = model_errors if widened is None else in_units(scales)
        errors = scaled_errors(_errors(candidate_leaves[candidate], oracle_leaves), scales)
        failing_leaves = list(dict.fromkeys(rows[i]["leaf"] for i in failing if rows[i]["candidate"] == candidate))
        for leaf, attribution in attribute_candidate(errors, errors_of, failing_leaves).items():
            found[(candidate, leaf)] = attribution
    own_rows = {(r["candidate"], r["leaf"]): r for r in rows if r["comparison"] == "vs_oracle"}
    for i in failing:
        row = rows[i]
        key = (row["candidate"], row["leaf"])
        fields = found[key].as_row_fields()
        own = own_rows.get(key)
        if not found[key].is_rounding and own is not None and own["verdict"] == "pass":
            fields.update(cause=WITHIN_MODEL.format(usage=format_number(own["bound_usage"])), cause_id=WITHIN_MODEL_ID)
        rows[i] = {**row, **fields}
    return rows
