"""The HTML report's verdict per implementation, then per cause the rows it explains."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mhc_parity.reports.causes import format_heading
from mhc_parity.reports.html_elements import esc, verdict_span

# Rows listed under one cause (the rest are in the per-case detail and the CSV).
MAX_ROWS_PER_CAUSE = 40


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
