"""The self-contained HTML report: layout, style sheet and section order (`render_html`), and its first screen.

One offline file: inline CSS, matplotlib plots as inline SVG, heatmaps as HTML tables; no images, scripts or fetched
resources. All text from rows, cases, errors or metadata goes through `esc`; anchors are generated ids, never raw case
names. Nothing is wider than the body: a too-wide table or figure scrolls in its own box.

The first screen: the run's verdict, its counts, the policy note, the worst leaf and, with a baseline, the gate's
verdict (`judgement`: pass, its first failing findings, or why it refuses the baseline); under it the verdict per
implementation, each cause opening to the rows it explains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from mhc_parity.records.schema import VERDICTS
from mhc_parity.reports.causes import format_heading
from mhc_parity.reports.gate.judgement import REFUSED, Judgement, first_findings_table, headline, hidden_findings
from mhc_parity.reports.html.figures import (
    MAX_BOUND_PANELS,
    bound_panels,
    bound_plot_section,
    histogram_section,
    histograms,
    speed_section,
)
from mhc_parity.reports.html.heatmaps import heatmap_section, heatmaps
from mhc_parity.reports.html.tables import (
    case_anchors,
    case_links,
    case_sections,
    drift_section,
    environment_section,
    esc,
    fmt,
    html_table,
    offenders_section,
    sharpness_section,
    td,
    verdict_span,
)
from mhc_parity.reports.summary import backend_terms_note, policy_note, summarize

MAX_OFFENDERS = 25
# Rows listed under one cause (the rest are in the per-case detail and the CSV).
MAX_ROWS_PER_CAUSE = 40
MAX_DRIFT_ROWS = 200

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1500px;
       padding: 0 1.2rem 3rem; color: #1b1b1b; background: #fafafa; }
h1 { margin: 0 0 .4rem; font-size: 1.6rem; }
h2 { border-bottom: 2px solid #ddd; padding-bottom: .2rem; margin-top: 2.2rem; }
.banner { padding: 1rem 1.2rem; border-radius: 6px; margin-top: 1rem; border: 2px solid; }
.banner.pass { background: #e8f6ec; border-color: #2e8b57; }
.banner.fail { background: #fdecea; border-color: #c0392b; }
.counts { list-style: none; padding: 0; margin: .4rem 0; display: flex; gap: .6rem; flex-wrap: wrap; }
.counts li { padding: .25rem .7rem; border-radius: 4px; background: #fff; border: 1px solid #ccc; }
.counts li.zero { color: #666; }
.counts b { font-size: 1.15rem; }
.gate { margin-top: .6rem; padding: .4rem .8rem; border-radius: 4px; background: #fff; border: 1px solid #ccc;
        border-left-width: 6px; }
.gate.pass { border-left-color: #2e8b57; }
.gate.fail { border-left-color: #c0392b; }
.gate.refused { border-left-color: #888; }
.gate p { margin: .3rem 0; }
nav ul { display: flex; gap: 1rem; flex-wrap: wrap; padding: 0; list-style: none; }
table { border-collapse: collapse; font-size: .82rem; margin: .5rem 0; background: #fff; }
th, td { border: 1px solid #ddd; padding: .2rem .45rem; text-align: left; vertical-align: top; }
th { background: #f0f0f0; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.reason { max-width: 40rem; overflow-wrap: anywhere; }
.v-pass { color: #1e7b45; font-weight: 600; }
.v-fail { color: #b3261e; font-weight: 700; }
.v-error { color: #fff; background: #b3261e; font-weight: 700; }
.v-skip, .v-unsupported { color: #666; }
.st-regression { color: #b3261e; font-weight: 700; }
.st-improvement { color: #1e7b45; }
figure { margin: 1rem 0; background: #fff; border: 1px solid #ddd; padding: .6rem; display: inline-block;
         max-width: 100%; box-sizing: border-box; vertical-align: top; }
svg.plot { max-width: 100%; height: auto; display: block; }
table.heatmap { font-size: .7rem; }
table.heatmap th.leaf { vertical-align: bottom; }
table.heatmap th.leaf span { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }
table.heatmap td.row { white-space: nowrap; }
table.heatmap td.hm { text-align: center; white-space: nowrap; padding: .1rem .3rem;
                      font-variant-numeric: tabular-nums; }
table.heatmap td.none { font-style: italic; }
table.heatmap td.failing { outline: 2px solid #000; outline-offset: -2px; }
.heatmap-legend .swatch { display: inline-block; padding: .1rem .5rem; margin-left: .3rem; font-size: .75rem; }
figcaption { font-size: .8rem; color: #444; max-width: 70rem; margin-top: .4rem; }
.empty { color: #666; font-style: italic; }
td.unmeasured { color: #666; font-style: italic; }
.case { margin: 1.2rem 0; }
.case h3 { margin-bottom: .3rem; overflow-wrap: anywhere; }
pre { margin: 0; white-space: pre-wrap; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; max-width: 100%; }
#rerun pre { background: #fff; border: 1px solid #ccc; padding: .4rem .6rem; margin-top: .3rem; }
"""


def rerun_section(rerun: str) -> str:
    """The command that reruns only the failing cases, copyable; "" when none failed."""
    if not rerun:
        return ""
    return f'<section id="rerun"><p>Rerun only the failing cases:</p><pre><code>{esc(rerun)}</code></pre></section>'


def navigation(with_drift: bool) -> str:
    """Links to the sections under the banner (drift only with a baseline)."""
    items = [
        ("summary", "Summary"),
        ("implementations", "Verdict per implementation"),
        ("bound-plots", "Failing and near-bound leaves"),
        ("sharpness", "Sharpness"),
        ("heatmaps", "Heatmaps"),
        ("histograms", "Histograms"),
        ("worst-offenders", "Worst offenders"),
    ]
    if with_drift:
        items.append(("drift", "Drift vs baseline"))
    items += [("speed", "Speed"), ("cases", "Cases"), ("environment", "Environment")]
    return "<nav><ul>" + "".join(f'<li><a href="#{i}">{esc(t)}</a></li>' for i, t in items) + "</ul></nav>"


def render_html(
    frame: pd.DataFrame,
    metadata: dict | None = None,
    *,
    summary: dict | None = None,
    judgement: Judgement | None = None,
    max_offenders: int = MAX_OFFENDERS,
    max_drift_rows: int = MAX_DRIFT_ROWS,
    rerun: str = "",
) -> str:
    """The whole report as one HTML document. frame: a canonical row frame; summary: `summarize(frame)`, computed if not
    given; judgement: the gate's against a baseline, which heads the banner and adds the drift section; rerun: the
    command rerunning only the failing cases."""
    metadata = metadata or {}
    summary = summarize(frame) if summary is None else summary
    anchors = case_anchors(frame["case"])
    tables = heatmaps(frame) if len(frame) else {}
    figures = histograms(frame)
    panels, qualifying = bound_panels(frame, MAX_BOUND_PANELS)
    title = f"mHC parity report — {'PASS' if page_passed(summary, judgement) else 'FAIL'}"
    sections = [
        summary_section(summary, judgement, metadata, anchors),
        rerun_section(rerun),
        implementations_section(summary["implementations"], anchors),
        navigation(judgement is not None),
        bound_plot_section(panels, qualifying, anchors),
        sharpness_section(summary["sharpness"]),
        heatmap_section(tables, anchors),
        histogram_section(figures),
        offenders_section(frame, anchors, max_offenders),
    ]
    if judgement is not None:
        sections.append(drift_section(judgement, anchors, max_drift_rows))
    sections += [speed_section(frame, anchors, metadata), case_sections(frame, anchors), environment_section(metadata)]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )


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
            **case_links(anchors),
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


def _cause_html(cause: Mapping, rows: Sequence[Mapping], anchors: Mapping[str, str]) -> str:
    items = "".join(
        f'<li><a href="#{esc(anchors.get(r["case"], ""))}">{esc(r["case"])}</a> · {esc(r["candidate"])} · '
        f"<b>{esc(r['leaf'])}</b> · usage {esc(r['usage'])}</li>"
        for r in rows[:MAX_ROWS_PER_CAUSE]
    )
    more = f"<li>… and {len(rows) - MAX_ROWS_PER_CAUSE} more</li>" if len(rows) > MAX_ROWS_PER_CAUSE else ""
    heading = format_heading(cause, quote=lambda name: f"<code>{esc(name)}</code>", text=esc)
    return f"<details><summary>{heading}</summary><ul>{items}{more}</ul></details>"


def implementations_section(implementations: Sequence[Mapping], anchors: Mapping[str, str]) -> str:
    """Each implementation's verdict; a failing one's causes, largest first, each opening to its rows. implementations:
    the summary's (`ImplementationVerdict.as_dict`, causes with their "members")."""
    parts = ['<section id="implementations"><h2>Verdict per implementation</h2><ul class="implementations">']
    for impl in implementations:
        causes = "".join(_cause_html(c, c.get("members", []), anchors) for c in impl["causes"])
        where = f" — {esc(impl['where'])}" if impl.get("where") else ""
        head = f"<b>{esc(impl['name'])}</b>: {verdict_span(impl['verdict'])} ({esc(impl['rows'])} rows){where}"
        parts.append(f"<li>{head}{causes}</li>")
    parts.append("</ul></section>")
    return "\n".join(parts)
