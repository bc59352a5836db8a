"""A rounding stated as a cause only where it holds across its implementation's failing leaves.

Each case names its failing rows' causes apart (`mhc_parity.harness.engine.causes`): the best
of some fifty hypotheses, value for value or by the size of its error. A precision bug's error
is its rounding's wherever that rounding acts, so it explains the failing leaves of every case
and path of the code it is in alike. A logic bug's error is no rounding's, and among fifty
hypotheses one matches a case's leaves by chance now and then: on the TPU v5e a
backward-kernel logic fault's failing rows on the mosaic paths were "not explained by any
rounding" 116 times and "the RMS statistic's sum of squares summed in bfloat16 term by term"
(matched by size, 0.82) 18 times, in one run (issue 56, item 7). No case alone can tell the 18
from a true cause; the implementation's other failing leaves can.

So over one run's rows, per implementation (the part of a row's `candidate` before the "/":
`mosaic/unsharded` and `mosaic/sharded(...)` run one code; `interpret` is another), each
(case, path, leaf) that fails is one attribution, whichever comparisons fail on it. The
hypotheses at one place (`hypothesis_place`: a site, a contraction) named on n of N of them
are named only where n > N/2: one bug is at one place, and a place that fits no more than
half an implementation's failing leaves is not that bug's (issue 67: a backward accumulator's
bug was named three places at once). Their rows say "not explained by any rounding" (or, where
the leaves name several places and none holds, "no single rounding explains these leaves"),
with what was fitted and why it is not named; their `cause_explained` (the fraction it
explained there) is kept. A pair is not named where either of its places is not.
Such a row keeps the cause its case named (`as_recorded` reads it back), so the rule is
always applied to the rows as recorded, and causes stated once are stated the same again.
Rows named through their partner (a sum in the partner's order, a leaf both paths hold
narrow: `PARTNER_NAMED`) rest on other evidence and are neither counted nor changed, nor are
`within_model` and `not_attributed` rows.

A sharded path that is right, beside its unsharded partner that is not (a fault in what the
unsharded run alone does), fails against its partner while its own error is within its
model; a rounding matched to that small error by size is the same chance match (the CPU's
kill matrix showed it: `docs/judging.md`), and counts and loses the same way.

The row stream (`rows.jsonl`) and the manifest's digest of each case hold its rows as the
case named them (`mhc_parity.records.store` digests rows `as_recorded`); every file and
report made of a finished run's rows states them through this rule (`rows.csv`, report.json,
the HTML and Markdown, the gate, the kill matrix's rows and top causes).
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
# The cause ids of a row judged within its model against the oracle, and of a case too large
# to attribute (`mhc_parity.harness.engine.causes`).
WITHIN_MODEL_ID = "within_model"
NOT_ATTRIBUTED_ID = "not_attributed"
# The cause id of a failing row of a run that skipped the search (`--no-causes`).
NOT_SEARCHED_ID = "not_searched"
# Cause ids that name no hypothesis.
NOT_HYPOTHESES = frozenset({UNEXPLAINED_CAUSE, WITHIN_MODEL_ID, NOT_ATTRIBUTED_ID, NOT_SEARCHED_ID, ""})
# What follows the hypothesis' words in a row named through its partner
# (`mhc_parity.harness.engine.causes`): a sum the partner's leaf names, in another order; a
# leaf this path and its partner both hold in a narrow dtype.
IN_ANOTHER_ORDER = " (named on {partner}, which sums it in another order)"
HELD_IN_ANOTHER_ORDER = (
    " (this path and {partner} both hold it in {dtype}, which the rounding model does not allow; "
    "each sums it in its own order)"
)
PARTNER_NAMED = tuple(template.rsplit("}", 1)[1] for template in (IN_ANOTHER_ORDER, HELD_IN_ANOTHER_ORDER))
# What a row whose rounding does not hold across its implementation says instead: no rounding
# where its place fits no more than half the failing leaves; where they name several places and
# none fits more than half, that no single one explains them. The cause as the case named it,
# words and id, is in it: `as_recorded` reads it back.
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


# The kinds a hypothesis name starts with (`mhc_parity.mhc.operation.hypotheses.name_problem`):
# a pair's two names are joined by "+", and a backend hypothesis' own name joins its
# primitives by "+" ("backend:exp+logistic:float32"), so a pair splits only before a kind.
HYPOTHESIS_KINDS = ("round", "accumulate", "fit", "backend")
_PAIR_JOIN = re.compile(r"\+(?=(?:{}):)".format("|".join(HYPOTHESIS_KINDS)))


def hypothesis_names(cause_id: str) -> list[str]:
    """The hypothesis names of a row's `cause_id` (one, or a pair's two); [] for the ids that
    name none (`NOT_HYPOTHESES`)."""
    return [] if cause_id in NOT_HYPOTHESES else _PAIR_JOIN.split(cause_id)


# A contraction whose sum is a site's only input: a narrow sum there is that value's error (the
# sum of squares is the RMS statistic's, whose error the fit models per token).
CONTRACTION_PLACES = {"mean_square": "rms_inverse"}


def hypothesis_place(name: str) -> str:
    """Where in the dataflow a hypothesis errs: the site it rounds or fits, or the contraction it
    sums narrowly ("gate_weight", "rms_inverse", "projection"), every backend primitive one place
    ("backend"). One bug at a place is matched by its different hypotheses on different leaves
    (the gate parameters rounded: the pre gate's on one leaf, both gates' on another; the RMS
    statistic rounded once in one case, fitted per token in another; a sum's blocks and orders)."""
    kind, _, rest = name.partition(":")
    if kind == "backend":
        return kind
    where = rest.split(":", 1)[0].split("/", 1)[0]
    return CONTRACTION_PLACES.get(where, where) if kind == "accumulate" else where


def _attribution(row: Mapping[str, Any]) -> tuple[str, str, str, str] | None:
    """(case, path, leaf, cause_id) of a failing row whose cause the rule weighs: no rounding,
    or hypotheses matched to the path's own error; None for any other row."""
    cause_id = str(row.get("cause_id") or "")
    if row.get("verdict") != "fail" or not (cause_id == UNEXPLAINED_CAUSE or hypothesis_names(cause_id)):
        return None
    if str(row.get("cause") or "").endswith(PARTNER_NAMED):
        return None
    return str(row["case"]), str(row["candidate"]), str(row["leaf"]), cause_id


def as_recorded(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """`row` with the cause its case named (`cause`, `cause_id`) where `consistent_causes` said
    it is not named (`NOT_NAMED` holds both), else `row` itself. A run's rows are recorded as
    their cases named them (the row stream, each case's digest in the manifest:
    `mhc_parity.records.store.case_records` reads rows through this), and its reports state
    them through the rule, so the rule is always applied to the rows as recorded."""
    if row.get("cause_id") != UNEXPLAINED_CAUSE:
        return row
    found = _NOT_NAMED_READ.fullmatch(str(row.get("cause") or ""))
    if found is None:
        return row
    return {**row, "cause": found["cause"], "cause_id": found["cause_id"]}


def stage_of(leaf: str) -> str:
    """The stage of `STAGES` a leaf comes out of: a gradient leaf (d_...) the backward's (the
    branch's parameters' its VJP, the rest the pre backward's), the output the post forward's,
    the other forward leaves the pre forward's."""
    if leaf.startswith("d_branch."):
        return "branch_backward"
    if leaf.startswith("d_"):
        return "pre_backward"
    return "post_forward" if leaf == "out" else "pre_forward"


def located(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """implementation -> where its failing rows go wrong first (`LOCATED`):
    whether a forward leaf fails, the earliest stage with a failing leaf and its leaves."""
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
    """implementation -> its failing (case, path, leaf, cause_id)s the rule weighs (`_attribution`)."""
    units: dict[str, set[tuple[str, str, str, str]]] = collections.defaultdict(set)
    for row in rows:
        found = _attribution(row)
        if found is not None:
            units[implementation_of(found[1])].add(found)
    return units


def _places_named(attributions) -> collections.Counter:
    """place -> how many of the (case, path, leaf, cause_id) `attributions` name a hypothesis there."""
    return collections.Counter(
        place
        for *_, cause_id in attributions
        for place in dict.fromkeys(hypothesis_place(name) for name in hypothesis_names(cause_id))
    )


def unheld_places(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(implementation, place) -> (failing leaves a hypothesis at the place is named on, those
    not explained by any rounding, the failing leaves weighed) for each place
    (`hypothesis_place`) named on no more than half of the implementation's failing
    (case, path, leaf)s (module docstring), in `rows` as recorded (`as_recorded`)."""
    unheld = {}
    for implementation, attributions in _units(map(as_recorded, rows)).items():
        unexplained = sum(cause_id == UNEXPLAINED_CAUSE for *_, cause_id in attributions)
        for place, count in _places_named(attributions).items():
            if 2 * count <= len(attributions):
                unheld[(implementation, place)] = (count, unexplained, len(attributions))
    return unheld


def consistent_causes(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """`rows` (one run's) with each failing row whose hypothesis does not hold across its
    implementation (its place in `unheld_places`) said to be not explained by one rounding
    (`NOT_NAMED`, naming what it fitted; "no single rounding" where the implementation's
    leaves name several places): `cause` and `cause_id` changed, `cause_explained` kept.
    Taken as recorded (`as_recorded`): rows stated once are stated the same again. Rows that
    stay as recorded are the same objects."""
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
