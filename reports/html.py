"""The self-contained HTML report.

One file, readable offline: inline CSS, the plots drawn by matplotlib as inline SVG
(`reports.plots`) and the heatmaps as HTML tables, no images, scripts, fonts or other
external resources. Every piece of text that comes from a row, a case, an error message
or the metadata is passed through `esc` (HTML escaping including quotes) before it
reaches the page; anchors are generated ids (`case-<n>-<slug>`), never raw case names.

Sections: summary banner, the failing and near-bound leaves (per case × candidate × partner
pair with a failing row or one at `reports.bound_plots.NEAR_BOUND` or more of its bound, at
most `MAX_BOUND_PANELS`: each leaf's error next to its bound, `reports.bound_plots`), sharpness,
error-ratio heatmaps (one table per comparison kind; the value rule is documented in
`reports.heatmaps`), max_rel_err histograms per leaf kind for bfloat16 and float32, the
worst-offenders table linking to per-case detail, drift against a baseline (when one is
given), per-case detail, and the environment.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pandas as pd

from records.schema import VERDICTS
from records.text import format_number
from reports.bound_plots import MAX_BOUND_PANELS, NEAR_BOUND, BoundPanel, bound_panel_svg, bound_panels
from reports.gate import FAILING_CATEGORIES, INFO_CATEGORIES, GateResult
from reports.heatmaps import LOG_RANGE, MAX_HEATMAP_ROWS, VERDICT_ABBREVIATIONS, Heatmap, cell_colour, heatmaps
from reports.histograms import BINS_PER_DECADE, Histogram, histogram_svg, histograms
from reports.html_elements import case_anchors, esc, fmt, num, table, td, verdict_span
from reports.html_verdicts import implementations_section
from reports.summary import FAILING_VERDICTS, policy_note, rank_offenders, summarize

MAX_OFFENDERS = 25
MAX_DRIFT_ROWS = 200
# Metadata keys shown first in the environment block (the rest follow, sorted).
PREFERRED_METADATA_KEYS = (
    "git_commit",
    "command_line",
    "start_time",
    "end_time",
    "wall_seconds",
    "suite",
    "backend",
    "device_kind",
    "device_count",
    "matmul_precision",
    "matmul_precision_note",
    "jax_version",
    "jaxlib_version",
    "flax_version",
    "policy_file",
    "policy_hash",
    "policy_is_default",
)

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
.counts b { font-size: 1.15rem; }
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
figure { margin: 1rem 0; background: #fff; border: 1px solid #ddd; padding: .6rem; display: inline-block; }
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
.case { margin: 1.2rem 0; }
.case h3 { margin-bottom: .3rem; overflow-wrap: anywhere; }
pre { margin: 0; white-space: pre-wrap; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; }
"""


def histogram_html(figure: Histogram) -> str:
    """One dtype's histogram (inline SVG) with its caption."""
    caption = (
        f"max_rel_err of the measured rows of {figure.dtype} leaves, one panel per leaf kind, in "
        f"log-spaced bins ({BINS_PER_DECADE} per decade) stacked by comparison kind. Exact zeros and "
        "NaN/inf values cannot sit on a log axis: each panel's title counts them."
    )
    return (
        f'<figure class="histogram" id="histogram-{esc(figure.dtype)}">{histogram_svg(figure)}'
        f"<figcaption><b>Error histogram — {esc(figure.dtype)}.</b> {esc(caption)}</figcaption></figure>"
    )


def bound_plot_html(panel: BoundPanel, index: int, anchors: dict[str, str]) -> str:
    """One pair's leaves against their bounds (inline SVG) with a caption linking its case."""
    usage = panel.worst_usage
    tally = f"{panel.failing} of {len(panel.leaves)} leaves failing" if panel.failing else f"{len(panel.leaves)} leaves"
    return (
        f'<figure class="bound-plot" id="bound-plot-{index}">{bound_panel_svg(panel, index)}'
        f'<figcaption><b><a href="#{anchors[panel.case]}">{esc(panel.case)}</a></b> · {esc(panel.candidate)} vs '
        f"{esc(panel.partner)} ({esc(panel.comparison)}): {esc(tally)}; largest bound usage "
        f"{fmt(usage)}.</figcaption></figure>"
    )


# ----------------------------------------------------------------------------- sections


def summary_section(summary: dict, gate_result: GateResult | None, metadata: dict | None = None) -> str:
    """The banner: overall status, verdict counts, the policy when it is not the packaged one
    (`reports.summary.policy_note` of `metadata`), worst leaf, gate line."""
    passed = summary["ok"] and (gate_result is None or gate_result.ok)
    status = "PASS" if passed else "FAIL"
    counts = "".join(
        f'<li class="count-{esc(v)}"><span class="v-{esc(v)}">{esc(v)}</span> <b>{summary["verdicts"][v]}</b></li>'
        for v in VERDICTS
    )
    counts += f'<li class="count-total">total <b>{summary["total"]}</b></li>'
    parts = [
        f'<header id="summary" class="banner {"pass" if passed else "fail"}">',
        f"<h1>mHC parity: {status}</h1>",
        f'<ul class="counts">{counts}</ul>',
    ]
    note = policy_note(metadata)
    if note:
        parts.append(f'<p id="policy-note"><b>{esc(note)}</b></p>')
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
    if gate_result is not None:
        parts.append(f'<p id="gate-line">{esc(gate_result.summary_line())}</p>')
    parts.append("</header>")
    return "\n".join(parts)


def sharpness_section(lines: Sequence[dict]) -> str:
    """Per comparison × activation dtype: how much of its bound a passing row uses; `lines`
    are the summary's "sharpness" records (`reports.summary.sharpness`)."""
    parts = [
        '<section id="sharpness"><h2>Sharpness</h2>',
        "<p>Bound usage (measured / allowed) of the passing rows: the median and the 90th "
        "percentile say how much headroom a bug has to hide in; the largest, how close correct "
        "code came to a false alarm.</p>",
    ]
    if not lines:
        parts.append('<p class="empty">No bounded rows.</p>')
    else:
        body = [
            [
                td(esc(r["comparison"])),
                td(esc(r["act_dtype"])),
                num(r["passing"]),
                num(r["failing"]),
                num(r["median_usage"]),
                num(r["p90_usage"]),
                num(r["max_usage"]),
            ]
            for r in lines
        ]
        parts.append(
            table(
                ["comparison", "activation dtype", "passing", "failing", "median usage", "p90 usage", "max usage"],
                body,
                table_id="sharpness-table",
            )
        )
    parts.append("</section>")
    return "\n".join(parts)


def bound_plot_section(panels: Sequence[BoundPanel], qualifying: int, anchors: dict[str, str]) -> str:
    """The failing and near-bound pairs' plots: `panels` of the `qualifying` pairs (`bound_panels`)."""
    parts = [
        '<section id="bound-plots"><h2>Failing and near-bound leaves</h2>',
        "<p>One plot per case × candidate × partner with a failing leaf or one at "
        f"{esc(format_number(NEAR_BOUND))} or more of its bound (bound usage). Per leaf, log scale: the dot is "
        "the candidate's error (<code>cand_oracle_max_err</code> against the float64 oracle; "
        "<code>max_rel_err</code> against the unsharded run on vs_unsharded rows), red where the leaf fails, "
        "orange where it passes near its bound; the bar is the error at which the leaf reaches its bound "
        "(error ÷ bound usage: the gap between dot and bar is the usage); the cross is what the rounding model "
        "explains (<code>oracle_sensitivity_max</code>); the diamond, the partner's own error against the "
        "oracle. A non-finite error is a triangle on the top edge, an exact zero one on the bottom edge; failing "
        "leaves' names are red. A row that errored has no numbers to draw: the worst offenders list it.</p>",
    ]
    if not panels:
        parts.append(
            f'<p class="empty">No leaf failed or used {esc(format_number(NEAR_BOUND))} or more of its bound.</p>'
        )
    elif qualifying > len(panels):
        parts.append(
            f"<p>The first {len(panels)} of {qualifying} pairs: failing pairs first, then by their largest bound "
            f"usage (at most {MAX_BOUND_PANELS} are drawn; every row is in the per-case detail).</p>"
        )
    parts += [bound_plot_html(panel, index, anchors) for index, panel in enumerate(panels)]
    parts.append("</section>")
    return "\n".join(parts)


def heatmap_legend() -> str:
    """The colour scale of the heatmaps, as swatches from 10**-LOG_RANGE to 10**LOG_RANGE."""
    swatches = []
    for value in [10.0**power for power in range(-int(LOG_RANGE), int(LOG_RANGE) + 1)] + [math.nan]:
        background, text = cell_colour(value)
        label = "no value" if math.isnan(value) else f"{value:g}"
        swatches.append(f'<span class="swatch" style="background:{background};color:{text}">{label}</span>')
    return '<p class="heatmap-legend">Colour (log scale): ' + "".join(swatches) + "</p>"


def heatmap_html(heatmap: Heatmap, anchors: dict[str, str]) -> str:
    """One comparison kind's heatmap: a table whose row labels link to the case's detail."""
    head = "<th>case [candidate]</th>" + "".join(
        f'<th class="leaf"><span>{esc(leaf)}</span></th>' for leaf in heatmap.leaves
    )
    body = []
    # The tables' columns are the leaves, in order: read as arrays, not cell by cell.
    values, verdicts = heatmap.values.to_numpy(dtype=float), heatmap.verdicts.to_numpy()
    failing, fallbacks = heatmap.failing.to_numpy(dtype=bool), heatmap.fallback.to_numpy(dtype=bool)
    for position, (case, candidate) in enumerate(heatmap.rows):
        cells = [f'<td class="row"><a href="#{anchors[case]}">{esc(case)}</a> [{esc(candidate)}]</td>']
        for column, leaf in enumerate(heatmap.leaves):
            value = float(values[position, column])
            verdict = str(verdicts[position, column])
            background, colour = cell_colour(value)
            css = "hm failing" if failing[position, column] else "hm"
            if math.isnan(value):  # no number: say why (its verdict)
                text, css = VERDICT_ABBREVIATIONS.get(verdict, ""), css + " none"
                measured = "no value"
            else:
                fallback = bool(fallbacks[position, column])
                text = format_number(value, 2) + ("*" if fallback else "")
                measured = ("bound_usage " if fallback else "oracle_ratio_max ") + format_number(value)
            title = f"{case} [{candidate}] · {leaf}: {measured} ({verdict or 'no row'})"
            cells.append(
                f'<td class="{css}" style="background:{background};color:{colour}" title="{esc(title)}">'
                f"{esc(text)}</td>"
            )
        body.append("<tr>" + "".join(cells) + "</tr>")
    aggregated = (
        f" More than {MAX_HEATMAP_ROWS} case × candidate pairs: one row per case, its worst candidate."
        if heatmap.aggregated
        else ""
    )
    caption = (
        f"{heatmap.comparison}: {len(heatmap.rows)} rows × {len(heatmap.leaves)} leaves.{aggregated} "
        "Hover a cell for its exact value."
    )
    return (
        f'<figure class="heatmap" id="heatmap-{esc(heatmap.comparison)}"><div class="scroll">'
        f'<table class="heatmap" id="heatmap-table-{esc(heatmap.comparison)}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
        f"<figcaption><b>Error ratio — {esc(heatmap.comparison)}.</b> {esc(caption)}</figcaption></figure>"
    )


def heatmap_section(tables: dict[str, Heatmap], anchors: dict[str, str]) -> str:
    """All heatmaps, or a note when there is nothing to show."""
    parts = [
        '<section id="heatmaps"><h2>Error ratio per case × leaf</h2>',
        "<p>Each cell is <code>oracle_ratio_max</code>: the candidate's max error against the float64 "
        "oracle divided by the partner's (1 = as accurate as the partner). Where that ratio is "
        "undefined (the partner is the oracle, or the partner's error is 0) the cell shows "
        "<code>bound_usage</code> instead, marked <code>*</code> (1 = exactly at the tolerance). "
        "Grey = no number (the cell names its verdict); a black frame = fail or error.</p>",
    ]
    if not tables:
        parts.append('<p class="empty">No rows to plot.</p>')
    else:
        parts.append(heatmap_legend())
    for heatmap in tables.values():
        parts.append(heatmap_html(heatmap, anchors))
    parts.append("</section>")
    return "\n".join(parts)


def histogram_section(figures: dict[str, Histogram | None]) -> str:
    """The per-dtype histogram figures."""
    parts = ['<section id="histograms"><h2>Error histograms</h2>']
    for dtype, figure in figures.items():
        if figure is None:
            parts.append(f'<p class="empty">No measured {esc(dtype)} rows.</p>')
        else:
            parts.append(histogram_html(figure))
    parts.append("</section>")
    return "\n".join(parts)


def offenders_section(frame: pd.DataFrame, anchors: dict[str, str], limit: int) -> str:
    """The worst rows (errors, fails, then highest bound usage) linking to their case."""
    ranked = rank_offenders(frame)
    parts = ['<section id="worst-offenders"><h2>Worst offenders</h2>']
    if not len(ranked):
        parts.append('<p class="empty">No measured rows.</p></section>')
        return "\n".join(parts)
    shown = ranked.head(limit)
    parts.append(f"<p>Errors and failures first, then by bound usage; {len(shown)} of {len(ranked)} measured rows.</p>")
    body = []
    for rank, row in enumerate(shown.to_dict(orient="records"), start=1):
        body.append(
            [
                td(str(rank), "num"),
                td(f'<a href="#{esc(anchors[row["case"]])}">{esc(row["case"])}</a>'),
                td(esc(row["candidate"])),
                td(esc(row["partner"])),
                td(esc(row["leaf"])),
                td(esc(row["dtype"])),
                td(verdict_span(row["verdict"])),
                num(row["bound_usage"]),
                num(row["oracle_ratio_max"]),
                num(row["max_rel_err"]),
                num(row["max_ulp"]),
                td(f"{row['nan_count']}/{row['inf_count']}", "num"),
                td(esc(row["reason"]), "reason"),
            ]
        )
    parts.append(
        table(
            (
                "#",
                "case",
                "candidate",
                "partner",
                "leaf",
                "dtype",
                "verdict",
                "bound usage",
                "oracle ratio",
                "max rel err",
                "max ulp",
                "nan/inf",
                "reason",
            ),
            body,
            table_id="worst-offenders-table",
        )
    )
    parts.append("</section>")
    return "\n".join(parts)


def drift_section(gate_result: GateResult, anchors: dict[str, str], limit: int) -> str:
    """Gate findings and the per-row growth factors against the baseline."""

    def case_link(case: str) -> str:
        anchor = anchors.get(case)
        return f'<a href="#{esc(anchor)}">{esc(case)}</a>' if anchor else esc(case)

    parts = [
        '<section id="drift"><h2>Drift against the baseline</h2>',
        f"<p>{esc(gate_result.summary_line())}</p>",
        "<p>Growth = current ÷ baseline oracle-relative error, both clamped below at "
        f"{esc(format_number(gate_result.noise_floor_ulps))} × eps of the leaf dtype (rounding noise); "
        f"growth above ×{esc(format_number(gate_result.growth_factor))} fails the gate.</p>",
    ]
    findings = [f for c in FAILING_CATEGORIES + INFO_CATEGORIES for f in gate_result.by_category(c)]
    if findings:
        parts.append(
            table(
                ("finding", "case", "candidate", "partner", "leaf", "detail"),
                (
                    [
                        td(f'<span class="st-{esc(f.category)}">{esc(f.category)}</span>'),
                        td(case_link(f.key[0])),
                        td(esc(f.key[1])),
                        td(esc(f.key[2])),
                        td(esc(f.key[3])),
                        td(esc(f.detail), "reason"),
                    ]
                    for f in findings[:limit]
                ),
                table_id="gate-findings-table",
            )
        )
        if len(findings) > limit:
            parts.append(f"<p>… and {len(findings) - limit} more findings.</p>")
    drifts = sorted(
        gate_result.drifts,
        key=lambda d: (math.isnan(d.worst_growth), -(d.worst_growth if not math.isnan(d.worst_growth) else 0), d.key),
    )
    if drifts:
        parts.append(
            f"<h3>Growth factors ({min(limit, len(drifts))} of {len(drifts)} matched rows, largest first)</h3>"
        )
        parts.append(
            table(
                (
                    "case",
                    "candidate",
                    "partner",
                    "leaf",
                    "dtype",
                    "baseline max",
                    "current max",
                    "growth max",
                    "baseline rms",
                    "current rms",
                    "growth rms",
                    "status",
                ),
                (
                    [
                        td(case_link(d.key[0])),
                        td(esc(d.key[1])),
                        td(esc(d.key[2])),
                        td(esc(d.key[3])),
                        td(esc(d.dtype)),
                        num(d.baseline_max),
                        num(d.current_max),
                        num(d.growth_max),
                        num(d.baseline_rms),
                        num(d.current_rms),
                        num(d.growth_rms),
                        td(f'<span class="st-{esc(d.status)}">{esc(d.status)}</span>'),
                    ]
                    for d in drifts[:limit]
                ),
                table_id="drift-table",
            )
        )
    else:
        parts.append('<p class="empty">No rows matched the baseline.</p>')
    parts.append("</section>")
    return "\n".join(parts)


def case_sections(frame: pd.DataFrame, anchors: dict[str, str]) -> str:
    """One section per case with every row of that case (open when it has failures)."""
    parts = ['<section id="cases"><h2>Per-case detail</h2>']
    if not len(frame):
        parts.append('<p class="empty">No cases.</p>')
    by_case: dict[str, list[dict]] = {}
    for record in frame.to_dict(orient="records"):  # one conversion for every case, in frame order
        by_case.setdefault(record["case"], []).append(record)
    for case in sorted(anchors):
        rows = by_case[case]
        counts = Counter(r["verdict"] for r in rows)
        tally = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])
        failing = any(r["verdict"] in FAILING_VERDICTS for r in rows)
        first = rows[0]
        body = [
            [
                td(esc(r["candidate"])),
                td(esc(r["partner"])),
                td(esc(r["comparison"])),
                td(esc(r["leaf"])),
                td(esc(r["dtype"])),
                td(verdict_span(r["verdict"])),
                num(r["max_abs_err"]),
                num(r["max_rel_err"]),
                num(r["rel_rms_err"]),
                num(r["max_ulp"]),
                num(r["p99_ulp"]),
                num(r["cosine"]),
                td(f"{r['nan_count']}/{r['inf_count']}", "num"),
                num(r["cand_oracle_max_err"]),
                num(r["partner_oracle_max_err"]),
                num(r["oracle_ratio_max"]),
                num(r["oracle_ratio_rms"]),
                num(r["bound_usage"]),
                td(esc(r["bound"]), "reason"),
                td(esc(r["reason"]), "reason"),
                num(r["compile_s"]),
                num(r["execute_s"]),
                td(esc(r["matmul_precision"])),
                td(esc(r["devices"])),
            ]
            for r in rows
        ]
        parts.append(
            f'<section class="case" id="{esc(anchors[case])}"><h3>{esc(case)}</h3>'
            f"<p>{esc(first['act_dtype'])} activations, {esc(first['weight_dtype'])} weights, "
            f"variant {esc(first['variant'])}, shape {esc(first['shape'])}, "
            f"mesh {esc(first['mesh'] or 'unsharded')}, tags {esc(first['tags'] or '—')}</p>"
            f"<details{' open' if failing else ''}><summary>{len(rows)} rows: {esc(tally)}</summary>"
        )
        parts.append(
            table(
                (
                    "candidate",
                    "partner",
                    "comparison",
                    "leaf",
                    "dtype",
                    "verdict",
                    "max abs",
                    "max rel",
                    "rel rms",
                    "max ulp",
                    "p99 ulp",
                    "cosine",
                    "nan/inf",
                    "cand↔oracle max",
                    "partner↔oracle max",
                    "ratio max",
                    "ratio rms",
                    "bound usage",
                    "bound",
                    "reason",
                    "compile s",
                    "execute s",
                    "matmul precision",
                    "devices",
                ),
                body,
            )
        )
        parts.append("</details></section>")
    parts.append("</section>")
    return "\n".join(parts)


def metadata_value_html(value: Any) -> str:
    """A metadata value: scalars as text, containers as pretty JSON."""
    if isinstance(value, (dict, list, tuple)):
        return f"<pre>{esc(json.dumps(value, indent=2, sort_keys=True, default=str))}</pre>"
    return esc(value)


def environment_section(metadata: dict) -> str:
    """The run metadata (versions, backend, commit, command line, times, policy hash)."""
    parts = ['<section id="environment"><h2>Environment</h2>']
    if not metadata:
        parts.append('<p class="empty">No metadata was recorded.</p></section>')
        return "\n".join(parts)
    keys = [k for k in PREFERRED_METADATA_KEYS if k in metadata]
    keys += sorted((k for k in metadata if k not in PREFERRED_METADATA_KEYS), key=str)
    parts.append(
        table(
            ("key", "value"),
            ([td(esc(k)), td(metadata_value_html(metadata[k]))] for k in keys),
            table_id="environment-table",
        )
    )
    parts.append("</section>")
    return "\n".join(parts)


def render_html(
    frame: pd.DataFrame,
    metadata: dict | None = None,
    *,
    summary: dict | None = None,
    gate_result: GateResult | None = None,
    max_offenders: int = MAX_OFFENDERS,
    max_drift_rows: int = MAX_DRIFT_ROWS,
) -> str:
    """The whole report as one HTML document (see the module docstring).

    `frame` is a canonical row frame (`records.rows.to_frame`); `summary` is
    `reports.summary.summarize(frame)`, computed here when not given; `gate_result`,
    when given, adds the drift section.
    """
    metadata = metadata or {}
    summary = summarize(frame) if summary is None else summary
    anchors = case_anchors(frame["case"])
    tables = heatmaps(frame) if len(frame) else {}
    figures = histograms(frame)
    panels, qualifying = bound_panels(frame)
    nav_items = [
        ("summary", "Summary"),
        ("implementations", "Verdict per implementation"),
        ("bound-plots", "Failing and near-bound leaves"),
        ("sharpness", "Sharpness"),
        ("heatmaps", "Heatmaps"),
        ("histograms", "Histograms"),
        ("worst-offenders", "Worst offenders"),
    ]
    if gate_result is not None:
        nav_items.append(("drift", "Drift vs baseline"))
    nav_items += [("cases", "Cases"), ("environment", "Environment")]
    nav = "<nav><ul>" + "".join(f'<li><a href="#{i}">{esc(t)}</a></li>' for i, t in nav_items) + "</ul></nav>"
    title = f"mHC parity report — {'PASS' if summary['ok'] and (gate_result is None or gate_result.ok) else 'FAIL'}"
    sections = [
        summary_section(summary, gate_result, metadata),
        implementations_section(summary["implementations"], anchors),
        nav,
        bound_plot_section(panels, qualifying, anchors),
        sharpness_section(summary["sharpness"]),
        heatmap_section(tables, anchors),
        histogram_section(figures),
        offenders_section(frame, anchors, max_offenders),
    ]
    if gate_result is not None:
        sections.append(drift_section(gate_result, anchors, max_drift_rows))
    sections += [case_sections(frame, anchors), environment_section(metadata)]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )
