"""A rounding stated as a cause only where its place holds across its implementation's failing leaves.

Per implementation (a row's `candidate` before the "/"), a place (`hypothesis_place`) named on no more than half of the
failing (case, path, leaf)s is not named: those rows say `UNEXPLAINED_WORDS` (or `NO_SINGLE_WORDS`) and carry the
recorded cause in their text, which `as_recorded` reads back. Rows named through their partner (`PARTNER_NAMED`),
`within_model` and `not_attributed` rows are neither counted nor changed. The row stream and the manifest keep rows as
recorded; every report of a finished run states them through this rule. Why and what it measured: docs/judging.md, "A
cause must hold across its implementation".
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Mapping
from typing import Any

from mhc_parity.records.path_names import implementation_of
from mhc_parity.records.schema import UNEXPLAINED_CAUSE

# The words of a failing row no rounding explains (`mhc_parity.harness.judging.attribution`).
UNEXPLAINED_WORDS = "not explained by any rounding: look for a logic error"
# Cause ids: within its model against the oracle; a case too large to attribute.
WITHIN_MODEL_ID = "within_model"
NOT_ATTRIBUTED_ID = "not_attributed"
# The cause id of a failing row of a run that skipped the search (`--no-causes`).
NOT_SEARCHED_ID = "not_searched"
# Cause ids that name no hypothesis.
NOT_HYPOTHESES = frozenset({UNEXPLAINED_CAUSE, WITHIN_MODEL_ID, NOT_ATTRIBUTED_ID, NOT_SEARCHED_ID, ""})
# What follows the hypothesis' words in a row named through its partner (`harness.engine.causes`).
IN_ANOTHER_ORDER = " (named on {partner}, which sums it in another order)"
HELD_IN_ANOTHER_ORDER = (
    " (this path and {partner} both hold it in {dtype}, which the rounding model does not allow; "
    "each sums it in its own order)"
)
PARTNER_NAMED = tuple(template.rsplit("}", 1)[1] for template in (IN_ANOTHER_ORDER, HELD_IN_ANOTHER_ORDER))
# What a row whose rounding does not hold across its implementation says instead; the recorded
# cause, words and id, is in it for `as_recorded`.
NO_SINGLE_WORDS = "no single rounding explains these leaves: look for where they meet"
NOT_NAMED = "{head} (not named: {cause} [{cause_id}]; {implementation}'s {failing} failing leaves: {counts})"
_HEADS = "|".join(re.escape(head) for head in (UNEXPLAINED_WORDS, NO_SINGLE_WORDS))
_NOT_NAMED_READ = re.compile(
    rf"(?:{_HEADS}) \(not named: (?P<cause>.*) \[(?P<cause_id>[^\[\]]+)\]; .*'s \d+ failing leaves: .*\)",
    re.DOTALL,
)
# Where in the dataflow an implementation goes wrong, stated before its failing rows' causes.
LOCATED = "forward {forward}; first fails in {stage} ({leaves})"
# The stages a leaf comes out of, in dataflow order (the kernels' programs; the branch's own VJP).
STAGES = ("pre_forward", "post_forward", "branch_backward", "pre_backward")
# A stage's leaves shown at most.
SHOWN_LEAVES = 3


# A pair's two names are joined by "+", as are a backend hypothesis' primitives
# ("backend:exp+logistic:float32"): a pair splits only before a kind.
HYPOTHESIS_KINDS = ("round", "accumulate", "fit", "backend")
_PAIR_JOIN = re.compile(r"\+(?=(?:{}):)".format("|".join(HYPOTHESIS_KINDS)))


def hypothesis_names(cause_id: str) -> list[str]:
    """The hypothesis names of a row's `cause_id` (one, or a pair's two); [] for the ids that
    name none (`NOT_HYPOTHESES`)."""
    return [] if cause_id in NOT_HYPOTHESES else _PAIR_JOIN.split(cause_id)


# A contraction whose sum is a site's only input: a narrow sum there is that site's error.
CONTRACTION_PLACES = {"mean_square": "rms_inverse"}


def hypothesis_place(name: str) -> str:
    """Where in the dataflow a hypothesis errs: the site it rounds or fits, or the contraction it sums narrowly
    ("gate_weight", "rms_inverse", "projection"); every backend primitive is one place ("backend")."""
    kind, _, rest = name.partition(":")
    if kind == "backend":
        return kind
    where = rest.split(":", 1)[0].split("/", 1)[0]
    return CONTRACTION_PLACES.get(where, where) if kind == "accumulate" else where


def _attribution(row: Mapping[str, Any]) -> tuple[str, str, str, str] | None:
    """(case, path, leaf, cause_id) of a failing row the rule weighs (no rounding, or hypotheses matched to the path's
    own error); else None."""
    cause_id = str(row.get("cause_id") or "")
    if row.get("verdict") != "fail" or not (cause_id == UNEXPLAINED_CAUSE or hypothesis_names(cause_id)):
        return None
    if str(row.get("cause") or "").endswith(PARTNER_NAMED):
        return None
    return str(row["case"]), str(row["candidate"]), str(row["leaf"]), cause_id


def as_recorded(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """`row` with the cause its case named where `consistent_causes` replaced it (`NOT_NAMED` holds both), else `row`
    itself."""
    if row.get("cause_id") != UNEXPLAINED_CAUSE:
        return row
    found = _NOT_NAMED_READ.fullmatch(str(row.get("cause") or ""))
    if found is None:
        return row
    return {**row, "cause": found["cause"], "cause_id": found["cause_id"]}


def stage_of(leaf: str) -> str:
    """The `STAGES` entry a leaf comes out of: d_branch.* the branch's VJP, other d_* the pre backward, "out" the post
    forward, the rest the pre forward."""
    if leaf.startswith("d_branch."):
        return "branch_backward"
    if leaf.startswith("d_"):
        return "pre_backward"
    return "post_forward" if leaf == "out" else "pre_forward"


def located(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """implementation -> where its failing rows go wrong first (`LOCATED`)."""
    failing: dict[str, dict[str, None]] = collections.defaultdict(dict)
    for row in rows:
        if row.get("verdict") == "fail" and row.get("cause_id"):  # a leaf compared, not a status row
            failing[implementation_of(str(row["candidate"]))][str(row["leaf"])] = None
    where = {}
    for implementation, leaves in failing.items():
        stage = min((stage_of(leaf) for leaf in leaves), key=STAGES.index)
        first = [leaf for leaf in leaves if stage_of(leaf) == stage]
        shown = ", ".join(first[:SHOWN_LEAVES]) + (
            f" +{len(first) - SHOWN_LEAVES}" if len(first) > SHOWN_LEAVES else ""
        )
        forward = "fails" if stage in STAGES[:2] else "passes"
        where[implementation] = LOCATED.format(forward=forward, stage=stage, leaves=shown)
    return where


def _units(rows: Iterable[Mapping[str, Any]]) -> dict[str, set[tuple[str, str, str, str]]]:
    units: dict[str, set[tuple[str, str, str, str]]] = collections.defaultdict(set)
    for row in rows:
        found = _attribution(row)
        if found is not None:
            units[implementation_of(found[1])].add(found)
    return units


def _places_named(attributions) -> collections.Counter:
    return collections.Counter(
        place
        for *_, cause_id in attributions
        for place in dict.fromkeys(hypothesis_place(name) for name in hypothesis_names(cause_id))
    )


def unheld_places(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(implementation, place) -> (failing leaves naming a hypothesis there, those no rounding explains, failing leaves
    weighed) for each place named on no more than half of them, over `rows` as recorded."""
    unheld = {}
    for implementation, attributions in _units(map(as_recorded, rows)).items():
        unexplained = sum(cause_id == UNEXPLAINED_CAUSE for *_, cause_id in attributions)
        for place, count in _places_named(attributions).items():
            if 2 * count <= len(attributions):
                unheld[(implementation, place)] = (count, unexplained, len(attributions))
    return unheld


def consistent_causes(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """`rows` (one run's, as recorded) with each failing row whose place is in `unheld_places` restated as `NOT_NAMED`:
    `cause` and `cause_id` changed, `cause_explained` kept. Unchanged rows are the same objects."""
    rows = [as_recorded(row) for row in rows]
    unheld = unheld_places(rows)
    if not unheld:
        return rows
    named = {implementation: _places_named(units) for implementation, units in _units(rows).items()}
    revised = []
    for row in rows:
        found = _attribution(row)
        implementation = implementation_of(str(row["candidate"]))
        places = [hypothesis_place(n) for n in hypothesis_names(found[3])] if found is not None else []
        held = [unheld[(implementation, p)] for p in places if (implementation, p) in unheld]
        if not held:
            revised.append(row)
            continue
        _, unexplained, failing = held[0]
        counts = named[implementation]
        listed = ", ".join(f"the roundings at {p} fit {n}" for p, n in counts.most_common())
        cause = NOT_NAMED.format(
            head=NO_SINGLE_WORDS
            if all((implementation, p) in unheld for p in counts) and len(counts) > 1
            else UNEXPLAINED_WORDS,
            cause=row.get("cause") or found[3],
            cause_id=found[3],
            implementation=implementation,
            failing=failing,
            counts=f"{listed}, no rounding {unexplained}",
        )
        revised.append({**row, "cause": cause, "cause_id": UNEXPLAINED_CAUSE})
    return revised
