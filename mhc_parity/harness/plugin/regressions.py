"""Which failing rows and gate findings of a case are one regression, and which test reports it.

One bug in a path breaks a leaf in every comparison that reads the leaf: a kernel's `out`
fails against the oracle and against the reference, a sharded path's against the oracle
and against its unsharded run, and the gate's growth of the leaf's error against the
oracle is the same number on each of those rows. Each is a row of its own (the reports
count rows), but a test per row would fail once per comparison for one bug. So a
regression is one (case, path, leaf): its failing rows in every comparison and its
failing gate findings. The rows carry one cause per (path, leaf) (`mhc_parity.harness.engine.causes`
attributes a path's leaves against the oracle, whatever the partner), so a regression has
one cause.

A row whose path holds its own bound against the oracle but differs from its partner by
more than the bound allows (cause `within_model`) fails because of the partner: when the
partner's leaf fails against the oracle in the same rows, the row is seen by the partner's
regression, not one of its own.

A regression fails one test: the first of its comparisons (`COMPARISON_ORDER`) whose test
the session selected. That choice needs only the rows and the selection, so every
test (on any xdist worker) agrees on it, and a regression whose comparisons' tests were
all deselected fails none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from mhc_parity.records.cause_consistency import WITHIN_MODEL_ID
from mhc_parity.records.schema import OK_VERDICTS
from mhc_parity.reports.gate import GateFinding

# The order in which a regression's comparisons claim it: the oracle, which judges each path
# alone, first (`ParitySession.comparisons_for` lists a case's tests in this order).
COMPARISON_ORDER = ("vs_oracle", "vs_reference", "vs_unsharded", "lowering", "compile")


def comparison_rank(comparison: str) -> tuple[int, str]:
    """Sort key of a comparison: `COMPARISON_ORDER`, then any other by name."""
    return (
        (COMPARISON_ORDER.index(comparison), "")
        if comparison in COMPARISON_ORDER
        else (len(COMPARISON_ORDER), comparison)
    )


@dataclasses.dataclass(frozen=True)
class Regression:
    """One failing leaf of one path in one case, with every row and gate finding that saw it.

    rows: its failing (fail or error) rows, in `COMPARISON_ORDER`; findings: its failing
    gate findings other than the rows' own failures, likewise."""

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
        """The comparisons that saw it, in `COMPARISON_ORDER`."""
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
    """The (case, path, leaf) of the regression a failing row belongs to: its own path's, or
    its partner's when its path is within its model and the partner's leaf fails against the oracle."""
    own = (str(row["case"]), str(row["candidate"]), str(row["leaf"]))
    partners = (str(row["case"]), str(row.get("partner") or ""), str(row["leaf"]))
    if row.get("cause_id") == WITHIN_MODEL_ID and partners in failing_vs_oracle:
        return partners
    return own


def find_regressions(rows: Iterable[Mapping[str, Any]], findings: Iterable[GateFinding] = ()) -> list[Regression]:
    """The regressions of a case's rows (those a test judges) and its gate's failing findings
    (other than "failure": a failing row is itself in `rows`), in the order the rows, then
    the findings, first name them."""
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
