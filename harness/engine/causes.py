"""A failing row's most likely cause, from the operation's hypotheses run through the oracle.

For a case with a failing row, the operation's hypotheses (`Operation.hypotheses`: roundings
its model does not allow) run once through the float64 oracle on the case's fixture
(`Operation.hypothesis_draws`). Each failing (candidate, leaf) then gets the hypothesis whose
error against the oracle best matches the candidate's (`harness.judging.attribution`), and
the row its `cause` and `cause_explained`. A case without a failing row runs none of this.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from cases.branches import get_branch
from harness.engine.operation import OPERATION
from harness.engine.oracle_path import named_leaves, noise_units
from harness.judging.attribution import Attribution, attribute_leaf, consensus, explained_fractions
from harness.judging.error_statistics import upcast
from records.text import format_number

# Where a candidate fails against its partner but holds its own bound against the oracle.
WITHIN_MODEL_ID = "within_model"
WITHIN_MODEL = (
    "within its rounding model against the oracle (usage {usage}): the partner is closer than the bound allows"
)


class HypothesisOracle:
    """Each case's hypotheses and their oracle leaves, computed once and the `keep` most recent kept.

    Called as (case, fixture) -> (hypotheses, one leaf -> float64 array mapping per
    hypothesis, named like a path's leaves). Thread-safe.
    """

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._answers: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, case, fixture) -> tuple[Sequence, list[dict[str, np.ndarray]]]:
        with self._lock:
            if case in self._answers:
                self._answers.move_to_end(case)
                return self._answers[case]
        branch = get_branch(case.branch)
        hypotheses = OPERATION.hypotheses(case, branch, noise_units(case))
        draws = OPERATION.hypothesis_draws(case, fixture, branch, hypotheses)
        answer = (hypotheses, [named_leaves(draw) for draw in draws])
        with self._lock:
            self._answers[case] = answer
            while len(self._answers) > self.keep:
                self._answers.popitem(last=False)
        return answer


def _needs_cause(row: dict, candidate_leaves: Mapping[str, Mapping], oracle_leaves: Mapping) -> bool:
    leaves = candidate_leaves.get(row["candidate"])
    return row["verdict"] == "fail" and leaves is not None and row["leaf"] in leaves and row["leaf"] in oracle_leaves


def annotate_causes(
    rows: Sequence[dict],
    case,
    fixture,
    *,
    oracle_leaves: Mapping[str, np.ndarray],
    candidate_leaves: Mapping[str, Mapping[str, np.ndarray]],
    hypotheses: HypothesisOracle,
) -> list[dict]:
    """`rows` (one case's) with `cause` and `cause_explained` set on every failing row that
    compared leaves. candidate_leaves: path name -> its leaves (the paths that ran)."""
    rows = list(rows)
    failing = [i for i, row in enumerate(rows) if _needs_cause(row, candidate_leaves, oracle_leaves)]
    if not failing:
        return rows
    chosen, hypothesis_leaves = hypotheses(case, fixture)
    own_rows = {(r["candidate"], r["leaf"]): r for r in rows if r["comparison"] == "vs_oracle"}
    errors, fractions = {}, {}
    for key in dict.fromkeys((rows[i]["candidate"], rows[i]["leaf"]) for i in failing):
        candidate, leaf = key
        exact = oracle_leaves[leaf]
        errors[key] = (
            upcast(candidate_leaves[candidate][leaf]) - exact,
            {h.name: (h.label, leaves[leaf] - exact) for h, leaves in zip(chosen, hypothesis_leaves)},
        )
        fractions[key] = explained_fractions(*errors[key])
    found: dict[tuple[str, str], Attribution] = {}
    for key in errors:  # each candidate's leaves prefer the cause of most of its failing leaves
        preferred = consensus([f for (candidate, _), f in fractions.items() if candidate == key[0]])
        found[key] = attribute_leaf(*errors[key], fractions=fractions[key], preferred=preferred)
    for i in failing:
        row = rows[i]
        key = (row["candidate"], row["leaf"])
        fields = found[key].as_row_fields()
        own = own_rows.get(key)
        if not found[key].is_rounding and own is not None and own["verdict"] == "pass":
            fields.update(cause=WITHIN_MODEL.format(usage=format_number(own["bound_usage"])), cause_id=WITHIN_MODEL_ID)
        rows[i] = {**row, **fields}
    return rows
