"""Which failing rows and gate findings of a case are one regression, and which test reports it.

One bug breaks a leaf in every comparison that reads it, so a regression is one (case, path, leaf): its
failing rows in every comparison and its failing gate findings, with one cause. A `within_model` row whose
partner's leaf fails against the oracle is the partner's regression. A regression fails the first of its
comparisons (`COMPARISON_ORDER`) whose test the session selected: the rows and the selection decide it, so
every xdist worker agrees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from mhc_parity.records.cause_consistency import WITHIN_MODEL_ID
from mhc_parity.records.schema import OK_VERDICTS
from mhc_parity.reports.gate.rule import GateFinding

# The order in which a regression's comparisons claim it: the oracle, judging each path alone, first.
COMPARISON_ORDER = ("vs_oracle", "vs_reference", "vs_unsharded", "lowering", "compile")


def comparison_rank(comparison: str) -> tuple[int, str]:
    return (
        (COMPARISON_ORDER.index(comparison), "")
        if comparison in COMPARISON_ORDER
        else (len(COMPARISON_ORDER), comparison)
    )


@dataclasses.dataclass(frozen=True)
class Regression:
    """One failing leaf of one path in one case: its failing rows and its gate findings (not the rows' own
    failures), each in `COMPARISON_ORDER`."""

    case: str
    candidate: str
    leaf: str
    rows: tuple[Mapping[str, Any], ...]
    findings: tuple[GateFinding, ...]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.case, self.candidate, self.leaf)

    @property
    def name(self) -> str:
        return f"{self.leaf} of {self.candidate}"

    @property
    def comparisons(self) -> tuple[str, ...]:
        seen = {str(r["comparison"]) for r in self.rows} | {f.comparison for f in self.findings}
        return tuple(sorted(seen, key=comparison_rank))

    def reporter(self, selected: Collection[str]) -> str | None:
        """The comparison whose test reports it: the first that saw it among `selected` (None: none)."""
        return next((c for c in self.comparisons if c in selected), None)


def _failing_vs_oracle(rows: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (r["case"], r["candidate"], r["leaf"])
        for r in rows
        if r["comparison"] == "vs_oracle" and r["verdict"] not in OK_VERDICTS
    }


def regression_key(row: Mapping[str, Any], failing_vs_oracle: Collection[tuple[str, str, str]]) -> tuple[str, str, str]:
    """The (case, path, leaf) a failing row belongs to: its own, or its partner's when it is within its
    model and the partner's leaf fails against the oracle."""
    own = (str(row["case"]), str(row["candidate"]), str(row["leaf"]))
    partners = (str(row["case"]), str(row.get("partner") or ""), str(row["leaf"]))
    if row.get("cause_id") == WITHIN_MODEL_ID and partners in failing_vs_oracle:
        return partners
    return own


def find_regressions(rows: Iterable[Mapping[str, Any]], findings: Iterable[GateFinding] = ()) -> list[Regression]:
    """The regressions of a case's judged rows and gate findings (other than "failure"), in the order the
    rows, then the findings, first name them."""
    rows = list(rows)
    failing_vs_oracle = _failing_vs_oracle(rows)
    by_key: dict[tuple[str, str, str], tuple[list, list]] = {}
    for row in rows:
        if row["verdict"] not in OK_VERDICTS:
            by_key.setdefault(regression_key(row, failing_vs_oracle), ([], []))[0].append(row)
    for finding in findings:
        case, candidate, _, leaf = finding.key
        by_key.setdefault((case, candidate, leaf), ([], []))[1].append(finding)
    return [
        Regression(
            *key,
            rows=tuple(sorted(found_rows, key=lambda r: comparison_rank(str(r["comparison"])))),
            findings=tuple(sorted(found, key=lambda f: comparison_rank(f.comparison))),
        )
        for key, (found_rows, found) in by_key.items()
    ]
