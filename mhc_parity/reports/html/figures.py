"""The page's figures: what each draws, drawn once, and the sections around them.

A bound plot puts per leaf a candidate's error next to its bound, the plot a reader of a failing run looks at first:
`bound_panels` picks the (case, candidate, partner) pairs of the bounded comparisons (`ERROR_COLUMNS`) with a row
failing or at `NEAR_BOUND` or more of its bound, failing pairs first, then by largest usage; at most `MAX_BOUND_PANELS`.
A histogram bins one dtype's `max_rel_err` per leaf kind and comparison, four bins a decade; zeros and NaN/inf, which a
log axis cannot hold, are counted in each panel's title. The Speed section's plot is `speed.roofline_figure`'s.

An SVG is a pure function of its drawing's code and arguments: `figure_svg` looks it up in `<cache>/figures` under the
drawing, the `repr` of its arguments (frozen dataclasses of plain values), the digest of the drawing module's import
closure and the matplotlib version; on a miss it imports `mhc_parity.reports.html.svg` (a report's only matplotlib
import), draws and stores it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from mhc_parity.records.artifact_store import ArtifactStore
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import closure_digest
from mhc_parity.records.schema import COMPARISONS, LEAF_KINDS
from mhc_parity.records.text import format_number
from mhc_parity.reports.html.tables import case_links, esc, fmt, html_table
from mhc_parity.reports.speed import (
    NO_PEAK,
    PROGRAM_SPEED_NOTE,
    SPEED_NOTE,
    program_speed_table,
    program_speeds,
    roofline_figure,
    speed_lines,
    speed_summaries,
    speedup_table,
)
from mhc_parity.reports.summary import FAILING_VERDICTS, UNMEASURED_VERDICTS

# Bump when an entry's layout or its key material changes meaning.
FIGURE_FORMAT = 1
# kind -> (the module that draws it, its function): imported only to draw.
DRAWINGS = {
    "bound_panel": ("mhc_parity.reports.html.svg", "bound_panel_svg"),
    "histogram": ("mhc_parity.reports.html.svg", "histogram_svg"),
    "roofline": ("mhc_parity.reports.html.svg", "roofline_svg"),
}


@functools.cache
def _drawing_material(kind: str) -> dict:
    module, function = DRAWINGS[kind]
    return {
        "format": FIGURE_FORMAT,
        "drawing": f"{module}:{function}",
        "code": closure_digest((module,)),
        "matplotlib": importlib.metadata.version("matplotlib"),
    }


@functools.cache
def _store() -> ArtifactStore:
    return ArtifactStore(cache_root() / "figures", "figure")


def figure_svg(kind: str, *arguments) -> str:
    """The `<svg>` element `DRAWINGS[kind]` draws of `arguments` (values whose `repr` names every field), stored or
    drawn now and stored."""
    material = {**_drawing_material(kind), "arguments": repr(arguments)}
    stored = _store().load(material)
    if stored is not None:
        return stored.decode("utf-8")
    module, function = DRAWINGS[kind]
    svg = getattr(importlib.import_module(module), function)(*arguments)
    _store().save(material, svg.encode("utf-8"))
    return svg


def figure_counts() -> dict[str, int]:
    """This process's figure lookups so far: {"figures_stored_loaded", "figures_stored_missed"}."""
    store = _store()
    return {"figures_stored_loaded": store.hits, "figures_stored_missed": store.misses}


# Bound usage from which a passing leaf counts as near its bound: within a factor of 2 (one bit) of failing.
NEAR_BOUND = 0.5
MAX_BOUND_PANELS = 8
# The error a comparison's bounds hold its candidate to (the y axis of its panels).
ERROR_COLUMNS = {
    "vs_oracle": "cand_oracle_max_err",
    "vs_reference": "cand_oracle_max_err",
    "vs_unsharded": "max_rel_err",
}


@dataclasses.dataclass(frozen=True)
class BoundPanel:
    """One (case, candidate, partner) pair of `comparison`: its measured and error rows, frame order, per leaf. bounds:
    errors ÷ bound_usage (NaN where it is 0, infinite or missing); partner_errors: NaN where the y axis is not the
    oracle error or the partner is the oracle."""

    case: str
    candidate: str
    partner: str
    comparison: str
    error_column: str
    leaves: tuple[str, ...]
    verdicts: tuple[str, ...]
    usages: tuple[float, ...]
    errors: tuple[float, ...]
    bounds: tuple[float, ...]
    explained: tuple[float, ...]
    partner_errors: tuple[float, ...]

    @property
    def failing(self) -> int:
        return sum(verdict in FAILING_VERDICTS for verdict in self.verdicts)

    @property
    def worst_usage(self) -> float:
        usages = [u for u in self.usages if not math.isnan(u)]
        return max(usages) if usages else math.nan


def _panel(key: tuple[str, str, str], rows: pd.DataFrame) -> BoundPanel:
    comparison = str(rows["comparison"].iloc[0])
    column = ERROR_COLUMNS[comparison]
    errors = rows[column].to_numpy(dtype=float)
    usages = rows["bound_usage"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        bounds = np.where((usages > 0) & np.isfinite(usages), errors / usages, math.nan)
    partner_errors = rows["partner_oracle_max_err"].to_numpy(dtype=float)
    if column != "cand_oracle_max_err" or key[2] == "oracle":
        partner_errors = np.full(len(rows), math.nan)
    return BoundPanel(
        *key,
        comparison=comparison,
        error_column=column,
        leaves=tuple(rows["leaf"]),
        verdicts=tuple(rows["verdict"]),
        usages=tuple(float(u) for u in usages),
        errors=tuple(float(e) for e in errors),
        bounds=tuple(float(b) for b in bounds),
        explained=tuple(float(s) for s in rows["oracle_sensitivity_max"].to_numpy(dtype=float)),
        partner_errors=tuple(float(p) for p in partner_errors),
    )


def bound_panels(frame: pd.DataFrame, limit: int = MAX_BOUND_PANELS) -> tuple[list[BoundPanel], int]:
    """(the panels to draw, at most `limit`, in the order above; how many pairs qualified)."""
    rows = frame[frame["comparison"].isin(list(ERROR_COLUMNS)) & ~frame["verdict"].isin(UNMEASURED_VERDICTS)]
    if not len(rows):
        return [], 0
    # an error row alone draws nothing (it has no numbers): the worst-offenders table lists it
    flagged = (rows["verdict"] == "fail") | (rows["bound_usage"] >= NEAR_BOUND)
    keys = ["case", "candidate", "partner"]
    chosen = rows[keys][flagged].drop_duplicates()
    panels = [_panel(key, group) for key, group in rows.merge(chosen, on=keys, sort=False).groupby(keys, sort=True)]
    panels.sort(key=_order)  # stable: pairs that tie stay in (case, candidate, partner) order
    return panels[:limit], len(panels)


def _order(panel: BoundPanel) -> tuple[bool, float]:
    usage = panel.worst_usage
    return panel.failing == 0, math.inf if math.isnan(usage) else -usage


HISTOGRAM_DTYPES = ("bfloat16", "float32")
BINS_PER_DECADE = 4


@dataclasses.dataclass(frozen=True)
class Panel:
    """One leaf kind: counts[comparison][i] rows in bin i; rows measured, and those exactly 0 or not finite (in no
    bin)."""

    kind: str
    counts: dict[str, tuple[int, ...]]
    rows: int
    zeros: int
    nonfinite: int


@dataclasses.dataclass(frozen=True)
class Histogram:
    """One dtype's figure: ascending log-spaced bin edges, the comparisons present and a panel per leaf kind present
    (schema order)."""

    dtype: str
    edges: tuple[float, ...]
    comparisons: tuple[str, ...]
    panels: tuple[Panel, ...]

    @property
    def decades(self) -> tuple[int, int]:
        return round(math.log10(self.edges[0])), round(math.log10(self.edges[-1]))


def histogram(frame: pd.DataFrame, dtype: str) -> Histogram | None:
    """The histogram of `dtype`'s measured rows (not skip/unsupported); None if there are none."""
    rows = frame[(frame["dtype"] == dtype) & ~frame["verdict"].isin(UNMEASURED_VERDICTS)]
    kinds = [k for k in LEAF_KINDS if k in set(rows["leaf_kind"])]
    if not kinds:
        return None
    errors = rows["max_rel_err"].astype(float)
    positive = errors[np.isfinite(errors) & (errors > 0)]
    if len(positive):
        low = math.floor(math.log10(positive.min()))
        high = max(math.ceil(math.log10(positive.max())), low + 1)
    else:
        low, high = -8, 0
    edges = np.logspace(low, high, BINS_PER_DECADE * (high - low) + 1)
    comparisons = tuple(c for c in COMPARISONS if c in set(rows["comparison"]))
    panels = []
    for kind in kinds:
        of_kind = rows[rows["leaf_kind"] == kind]
        kind_errors = of_kind["max_rel_err"].astype(float).to_numpy()
        counts = {}
        for comparison in comparisons:
            values = of_kind.loc[of_kind["comparison"] == comparison, "max_rel_err"].to_numpy(dtype=float)
            binned, _ = np.histogram(values[np.isfinite(values) & (values > 0)], bins=edges)
            counts[comparison] = tuple(int(n) for n in binned)
        panels.append(
            Panel(
                kind,
                counts,
                rows=len(of_kind),
                zeros=int((kind_errors == 0).sum()),
                nonfinite=int((~np.isfinite(kind_errors)).sum()),
            )
        )
    return Histogram(dtype, tuple(float(e) for e in edges), comparisons, tuple(panels))


def histograms(frame: pd.DataFrame) -> dict[str, Histogram | None]:
    return {dtype: histogram(frame, dtype) for dtype in HISTOGRAM_DTYPES}


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


def histogram_section(figures: dict[str, Histogram | None]) -> str:
    parts = ['<section id="histograms"><h2>Error histograms</h2>']
    for dtype, figure in figures.items():
        if figure is None:
            parts.append(f'<p class="empty">No measured {esc(dtype)} rows.</p>')
        else:
            parts.append(histogram_html(figure))
    parts.append("</section>")
    return "\n".join(parts)


def speed_section(frame: pd.DataFrame, anchors: dict[str, str], metadata: dict | None = None) -> str:
    """Per case and program, device time, bytes and fraction of the chip's peak (with its plot where stated); then each
    path's time beside its reference's, CPU times greyed."""
    parts = ['<section id="speed"><h2>Speed</h2>', _program_speed_html(frame, anchors, metadata or {})]
    parts.append(f"<h3>Against the reference</h3><p>{esc(SPEED_NOTE)}</p>")
    lines = speed_lines(frame)
    if not lines:
        parts.append('<p class="empty">No path ran beside a reference path with both timed.</p></section>')
        return "\n".join(parts)
    parts.append("<ul>" + "".join(f"<li>{esc(s.text)}</li>" for s in speed_summaries(lines)) + "</ul>")
    parts.append(html_table(speedup_table(lines), table_id="speed-table", cells=case_links(anchors)))
    parts.append("</section>")
    return "\n".join(parts)


def _program_speed_html(frame: pd.DataFrame, anchors: dict[str, str], metadata: dict) -> str:
    speeds = program_speeds(frame, metadata)
    parts = [f"<h3>Device time and bandwidth</h3><p>{esc(PROGRAM_SPEED_NOTE)}</p>"]
    if not speeds:
        parts.append('<p class="empty">No program was timed.</p>')
        return "\n".join(parts)
    figure = roofline_figure(speeds)
    if figure is None:
        parts.append(f"<p>No program ran on a chip whose peak is stated ({esc(NO_PEAK)}): GB/s only, no plot.</p>")
    else:
        parts.append(
            f'<figure class="roofline" id="roofline">{figure_svg("roofline", figure)}<figcaption><b>Fraction of the '
            f"peak HBM bandwidth per case and program</b> ({esc(figure.device_kind)}, "
            f"{esc(format_number(figure.peak_gb_per_s))} GB/s): each program's bytes over its device time.</figcaption>"
            "</figure>"
        )
    parts.append(html_table(program_speed_table(speeds), table_id="program-speed-table", cells=case_links(anchors)))
    return "\n".join(parts)
