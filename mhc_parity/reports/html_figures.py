"""The HTML report's figure sections: bound plots, heatmaps (HTML tables) and histograms, with their captions; the SVGs
come from `figure_store`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mhc_parity.records.text import format_number
from mhc_parity.reports.bound_plots import MAX_BOUND_PANELS, NEAR_BOUND, BoundPanel
from mhc_parity.reports.figure_store import figure_svg
from mhc_parity.reports.heatmaps import LOG_RANGE, MAX_HEATMAP_ROWS, VERDICT_ABBREVIATIONS, Heatmap, cell_colour
from mhc_parity.reports.histograms import BINS_PER_DECADE, Histogram
from mhc_parity.reports.html_elements import esc, fmt


def histogram_html(figure: Histogram) -> str:
    """One dtype's histogram (inline SVG) with its caption."""
    caption = (
        f"max_rel_err of the measured rows of {figure.dtype} leaves, one panel per leaf kind, in "
        f"log-spaced bins ({BINS_PER_DECADE} per decade) stacked by comparison kind. Exact zeros and "
        "NaN/inf values cannot sit on a log axis: each panel's title counts them."
    )
    return (
        f'<figure class="histogram" id="histogram-{esc(figure.dtype)}">{figure_svg("histogram", figure)}'
        f"<figcaption><b>Error histogram — {esc(figure.dtype)}.</b> {esc(caption)}</figcaption></figure>"
    )


def bound_plot_html(panel: BoundPanel, index: int, anchors: dict[str, str]) -> str:
    """One pair's leaves against their bounds (inline SVG) with a caption linking its case."""
    usage = panel.worst_usage
    tally = f"{panel.failing} of {len(panel.leaves)} leaves failing" if panel.failing else f"{len(panel.leaves)} leaves"
    return (
        f'<figure class="bound-plot" id="bound-plot-{index}">{figure_svg("bound_panel", panel, index)}'
        f'<figcaption><b><a href="#{anchors[panel.case]}">{esc(panel.case)}</a></b> · {esc(panel.candidate)} vs '
        f"{esc(panel.partner)} ({esc(panel.comparison)}): {esc(tally)}; largest bound usage "
        f"{fmt(usage)}.</figcaption></figure>"
    )


def bound_plot_section(panels: Sequence[BoundPanel], qualifying: int, anchors: dict[str, str]) -> str:
    """The plots of `panels`, the first of the `qualifying` pairs (`bound_panels`)."""
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
    """One comparison kind's heatmap table, row labels linking to the cases."""
    head = "<th>case [candidate]</th>" + "".join(
        f'<th class="leaf"><span>{esc(leaf)}</span></th>' for leaf in heatmap.leaves
    )
    body = []
    # Read as arrays, not cell by cell.
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
    parts = ['<section id="histograms"><h2>Error histograms</h2>']
    for dtype, figure in figures.items():
        if figure is None:
            parts.append(f'<p class="empty">No measured {esc(dtype)} rows.</p>')
        else:
            parts.append(histogram_html(figure))
    parts.append("</section>")
    return "\n".join(parts)
