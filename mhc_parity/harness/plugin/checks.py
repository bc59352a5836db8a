"""The parity tests: one item per case x comparison (ids `<case>::<comparison>`), and what each asserts and
says. A regression fails the first selected comparison's test that saw it; another test that saw only
regressions reported elsewhere is skipped, naming that test."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pytest

from mhc_parity.harness.plugin.regressions import Regression, comparison_rank, find_regressions
from mhc_parity.harness.plugin.session import GateTally
from mhc_parity.records.text import format_number, format_text_table, plural
from mhc_parity.reports.causes import cause_groups
from mhc_parity.reports.gate.rule import FAILING_CATEGORIES, FINDING_NOUNS, GateFinding, GateResult
from mhc_parity.reports.terminal import rows_table

if TYPE_CHECKING:
    from mhc_parity.harness.plugin.session import ParitySession

# At most this many regressions are named in the reason of a test skipped for them.
NAMED_ELSEWHERE = 4


@dataclasses.dataclass(frozen=True)
class ParityCheck:
    """One parametrised test: a case and one comparison kind (of the session that runs it)."""

    case: object
    comparison: str
    session: ParitySession = dataclasses.field(compare=False, repr=False)

    @property
    def id(self) -> str:
        return f"{self.case.name}::{self.comparison}"

    def check(self) -> None:
        """`check_parity(self)`, for a test module that imports nothing of mhc-parity."""
        check_parity(self)


def leaf_table(rows) -> str:
    return rows_table(rows, limit=None)


def _leaves(n: int) -> str:
    return f"{n} {'leaf' if n == 1 else 'leaves'}"


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def regression_table(rows) -> str:
    """A regression's rows, one per comparison that saw it, with its numbers (an error's: its cause
    heading's) and bound; nothing cut."""
    body = [
        (
            r["leaf"],
            r["candidate"],
            r["comparison"],
            r["partner"] or "-",
            r["verdict"],
            format_number(r["bound_usage"], nan="-"),
            "-" if r["verdict"] == "error" else (r["reason"] or "-"),
            r["bound"] or "-",
        )
        for r in rows
    ]
    headers = ("leaf", "candidate", "comparison", "partner", "verdict", "usage", "measured", "bound")
    return format_text_table(headers, body, indent="  ", limit=None)


def failed_rows_message(check: ParityCheck, regressions: Sequence[Regression], judged: Sequence[dict]) -> str:
    """The failing rows of the regressions a test reports, by cause: each heading once, then its rows."""
    rows = [r for g in regressions for r in g.rows]
    comparisons = sorted({str(r["comparison"]) for r in rows}, key=comparison_rank)
    counts = Counter(str(r["comparison"]) for r in rows)
    totals = Counter(str(r["comparison"]) for r in judged)
    per_comparison = ", ".join(f"{counts[c]} of {totals[c]} {c}" for c in comparisons)
    lines = [f"{plural(len(rows), 'failing row')} of {check.case.name} ({per_comparison}), by cause:"]
    for group in cause_groups(rows):
        lines += ["", group.heading(), regression_table(group.rows)]
    return "\n".join(lines)


def _worst(finding: GateFinding, result: GateResult) -> str:
    _, candidate, partner, leaf = finding.key
    if finding.category == "regression":
        return (
            f"leaf {leaf} ({candidate} vs {partner}) grew x{format_number(finding.growth)} "
            f"> allowed x{result.growth_factor:g} and the rounding spread"
        )
    return f"{finding.category.replace('_', ' ')} leaf {leaf} ({candidate} vs {partner}): {finding.detail}"


def gate_failure(check: ParityCheck, regressions: Sequence[Regression], result: GateResult) -> str:
    """The gate's failing findings of the regressions a test reports: a headline with the worst, counts per
    category, then each finding."""
    findings = [f for g in regressions for f in g.findings]
    gate_order = {id(f): i for i, f in enumerate(result.failing_findings())}  # by category, the worst first
    worst = min(findings, key=lambda f: gate_order[id(f)])
    leaves = {(f.category, *regression.key) for regression in regressions for f in regression.findings}
    counts = Counter(category for category, *_ in leaves)
    found = ", ".join(
        f"{counts[category]} {FINDING_NOUNS[category][counts[category] != 1]}"
        for category in FAILING_CATEGORIES
        if counts[category]
    )
    comparisons = sorted({f.comparison for f in findings}, key=comparison_rank)
    more = f" (and {len(leaves) - 1} more)" if len(leaves) > 1 else ""
    ordered = [
        (f.category, f.key[3], f.key[1], f.comparison, f.key[2], f.detail)
        for category in FAILING_CATEGORIES
        for regression in regressions
        for f in regression.findings
        if f.category == category
    ]
    headers = ("finding", "leaf", "candidate", "comparison", "partner", "detail")
    table = format_text_table(headers, ordered, indent="  ", limit=None)
    return (
        f"{check.id}: gate FAIL against {check.session.baseline_shown}: {_worst(worst, result)}{more}\n"
        f"{found}, seen by {_and(comparisons)} (growth factor x{result.growth_factor:g}, "
        f"noise floor {result.noise_floor_ulps:g} ulps):\n{table}"
    )


def regressions_message(
    check: ParityCheck,
    regressions: Sequence[Regression],
    judged: Sequence[dict],
    result: GateResult | None,
    elsewhere: str = "",
) -> str:
    """A test's failure message: the regressions it reports, each with every comparison that saw it; last,
    `elsewhere` names those others report."""
    comparisons = sorted({c for g in regressions for c in g.comparisons}, key=comparison_rank)
    parts = [
        f"{check.id}: {_leaves(len(regressions))} failed, seen by {_and(comparisons)} "
        "(every comparison that saw each is below; no other test reports them)"
    ]
    if any(g.rows for g in regressions):
        parts.append(failed_rows_message(check, [g for g in regressions if g.rows], judged))
    if result is not None and any(g.findings for g in regressions):
        parts.append(gate_failure(check, [g for g in regressions if g.findings], result))
    return "\n\n".join([*parts, elsewhere] if elsewhere else parts)


def reported_elsewhere(check: ParityCheck, regressions: Sequence[Regression], selected) -> str:
    """Why a test that saw only regressions another test reports is skipped: that test, and the leaves."""
    reporters = sorted({f"{check.case.name}::{g.reporter(selected)}" for g in regressions})
    names = [g.name for g in regressions[:NAMED_ELSEWHERE]]
    if len(regressions) > NAMED_ELSEWHERE:
        names.append(f"{len(regressions) - NAMED_ELSEWHERE} more")
    return (
        f"{check.id}: its failing leaves are reported by {_and(reporters)}, "
        f"with every comparison that saw them: {_and(names)}"
    )


def _gate_findings(result: GateResult | None) -> list[GateFinding]:
    """The gate's failing findings but the rows' own failures (a failing row is a regression's row)."""
    return [] if result is None else [f for f in result.failing_findings() if f.category != "failure"]


def _gate_counts(check: ParityCheck, result: GateResult | None, findings: Sequence[GateFinding]) -> GateTally | None:
    if result is None:
        return None if check.session.baseline_run is None else GateTally(ungated=1)
    mine = lambda found: [f for f in found if f.comparison == check.comparison]  # noqa: E731
    matched = sum(d.comparison == check.comparison for d in result.drifts)
    return GateTally(1, 0, matched, len(mine(findings)), len(mine(result.improvements)), len(mine(result.new_rows)))


def check_parity(check: ParityCheck) -> None:
    """Assert that no regression its comparison saw is this test's to report: every row of the comparison
    passed or is an explained skip and, when gated, the gate finds nothing failing. A regression another
    selected test reports skips this one, naming it."""
    session = check.session
    judged = session.judged_rows(check.case)
    rows = [r for r in judged if r["comparison"] == check.comparison]
    result = session.case_gate(check.case)
    findings = _gate_findings(result)
    counts = _gate_counts(check, result, findings)
    if counts is not None:
        session.gate_counts[check.id] = dataclasses.astuple(counts)
    seen = [g for g in find_regressions(judged, findings) if check.comparison in g.comparisons]
    # The selection decides the reporter; this test is in it even when called outside it.
    selected = session.selected.get(check.case.name, frozenset()) | {check.comparison}
    mine = [g for g in seen if g.reporter(selected) == check.comparison]
    others = [g for g in seen if g.reporter(selected) != check.comparison]
    elsewhere = reported_elsewhere(check, others, selected) if others else ""
    if mine:
        pytest.fail(regressions_message(check, mine, judged, result, elsewhere), pytrace=False)
    if others:
        session.reported_elsewhere.add(check.id)
        pytest.skip(elsewhere)
    if not rows:
        pytest.skip(f"{check.case.name} makes no {check.comparison} comparison on this machine")
    if all(r["verdict"] == "skip" for r in rows):
        pytest.skip("; ".join(sorted({r["reason"] for r in rows}))[:300])


def check_params(session: ParitySession) -> list:
    """The `parity_check` parameters: each case's comparisons, ids `<case>::<comparison>`; a case's tests
    share an xdist group, a sharded case's are marked so."""
    params = []
    for case in session.prepared.cases:
        marks = [pytest.mark.xdist_group(case.name)]
        if case.mesh is not None:
            marks.append(pytest.mark.sharded)
        for comparison in session.comparisons_for(case):
            check = ParityCheck(case, comparison, session)
            params.append(pytest.param(check, id=check.id, marks=marks))
    return params
