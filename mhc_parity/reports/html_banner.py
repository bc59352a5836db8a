"""The HTML report's first screen: the run's verdict, its counts, the policy note, the worst leaf and, with a baseline,
the gate's verdict (`judgement`): pass, its first failing findings, or why it refuses the baseline.
"""

from __future__ import annotations

from mhc_parity.records.schema import VERDICTS
from mhc_parity.reports.gate.judgement import REFUSED, Judgement, first_findings_table, headline, hidden_findings
from mhc_parity.reports.html_elements import case_link, esc, fmt, html_table, td, verdict_span
from mhc_parity.reports.summary import backend_terms_note, policy_note


def page_passed(summary: dict, judgement: Judgement | None) -> bool:
    """The page's verdict: the run passed and, with a baseline, the gate did not fail it (a refused baseline says
    nothing of the code)."""
    return summary["ok"] and (judgement is None or not judgement.failed)


def count_item(verdict: str, count: int) -> str:
    """One verdict's count in the banner; a zero is drawn neutral, never in its verdict's alarm colour."""
    label = f'<span class="v-{esc(verdict)}">{esc(verdict)}</span>' if count else f"<span>{esc(verdict)}</span>"
    zero = " zero" if not count else ""
    return f'<li class="count-{esc(verdict)}{zero}">{label} <b>{count}</b></li>'


def gate_verdict_html(judgement: Judgement, anchors: dict[str, str]) -> str:
    """The gate's verdict for the banner: headline, first failing findings, a link to the rest."""
    css = {REFUSED: "refused"}.get(judgement.verdict, judgement.verdict.lower())
    parts = [
        f'<div id="gate-verdict" class="gate {css}">',
        f'<p class="gate-headline"><b>{esc(headline(judgement))}</b></p>',
    ]
    parts += [f'<p class="gate-scope">{esc(line)}</p>' for line in (*judgement.scope, *judgement.remarks)]
    result = judgement.result
    if result is not None and not result.ok:
        cells = {
            "case": lambda case: td(case_link(case, anchors)),
            "leaf": lambda leaf: td(f"<b>{esc(leaf)}</b>"),
            "detail": lambda detail: td(esc(detail), "reason"),
        }
        parts.append(html_table(first_findings_table(result), table_id="gate-first-findings", cells=cells))
        more = hidden_findings(result)
        rest = f"… and {more} more failing findings; " if more else ""
        parts.append(f'<p>{esc(rest)}<a href="#drift">every finding and growth factor</a></p>')
    elif result is not None:
        parts.append('<p><a href="#drift">the growth factor of every matched row</a></p>')
    parts.append("</div>")
    return "\n".join(parts)


def summary_section(
    summary: dict, judgement: Judgement | None, metadata: dict | None = None, anchors: dict[str, str] | None = None
) -> str:
    """The banner: status, verdict counts, the policy and backend-terms notes when they apply, the worst leaf, the
    gate's verdict (cases linked through `anchors`)."""
    passed = page_passed(summary, judgement)
    status = "PASS" if passed else "FAIL"
    counts = "".join(count_item(v, summary["verdicts"][v]) for v in VERDICTS)
    counts += f'<li class="count-total">total <b>{summary["total"]}</b></li>'
    parts = [
        f'<header id="summary" class="banner {"pass" if passed else "fail"}">',
        f"<h1>mHC parity: {status}</h1>",
        f'<ul class="counts">{counts}</ul>',
    ]
    for anchor, note in (("policy-note", policy_note(metadata)), ("backend-terms-note", backend_terms_note(metadata))):
        if note:
            parts.append(f'<p id="{anchor}"><b>{esc(note)}</b></p>')
    if not summary["total"]:
        parts.append('<p class="empty">No rows were produced.</p>')
    worst = summary["worst_leaf"]
    if worst:
        parts.append(
            f'<p id="worst-leaf">Worst leaf by bound usage: <b>{esc(worst["case"])}</b> · '
            f"{esc(worst['candidate'])} vs {esc(worst['partner'])} · <b>{esc(worst['leaf'])}</b> "
            f"({esc(worst['dtype'])}, {esc(worst['comparison'])}) — {fmt(worst['bound_usage'])} of its bound, "
            f"{verdict_span(worst['verdict'])}. Bound: {esc(worst['bound'])}</p>"
        )
    if judgement is not None:
        parts.append(gate_verdict_html(judgement, anchors or {}))
    parts.append("</header>")
    return "\n".join(parts)
