"""The HTML report's tables and the pieces every section is built of. Text from rows, cases, errors or metadata goes
through `esc`, and the cells built here take already-escaped HTML; case names link through generated anchors
(`case_anchors`), never raw names. `html_table` prints a `mhc_parity.reports.tables.Table`; the sections here:
sharpness, worst offenders, drift, per-case detail, environment.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from mhc_parity.records.schema import VERDICTS
from mhc_parity.records.text import format_number
from mhc_parity.reports.gate.drift import settings_note
from mhc_parity.reports.gate.judgement import Judgement
from mhc_parity.reports.gate.rule import FAILING_CATEGORIES, INFO_CATEGORIES, findings_table
from mhc_parity.reports.summary import FAILING_VERDICTS, rank_offenders
from mhc_parity.reports.tables import Cell, Table


def esc(value: Any) -> str:
    """Text escaped for HTML element content and quoted attribute values."""
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """A metric for a table cell (`mhc_parity.records.text.format_number`), "—" for NaN (not measured)."""
    return esc(format_number(value, nan="—"))


def case_anchors(cases: Iterable[str]) -> dict[str, str]:
    """A unique, URL-safe element id per case name (position + sanitised slug)."""
    anchors = {}
    for index, case in enumerate(sorted(set(cases))):
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", case).strip("-")[:40]
        anchors[case] = f"case-{index}" + (f"-{slug}" if slug else "")
    return anchors


def case_link(case: str, anchors: dict[str, str]) -> str:
    """A case name linking to its section, or plain text where the page has none (a baseline-only row)."""
    anchor = anchors.get(case)
    return f'<a href="#{esc(anchor)}">{esc(case)}</a>' if anchor else esc(case)


def verdict_span(verdict: str) -> str:
    return f'<span class="v-{esc(verdict)}">{esc(verdict)}</span>'


def table(headers: Sequence[str], body_rows: Iterable[Sequence[str]], *, table_id: str = "") -> str:
    """An HTML table; header texts are escaped here, body cells must already be HTML."""
    id_attr = f' id="{esc(table_id)}"' if table_id else ""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(body) + "</tr>" for body in body_rows)
    return f'<div class="scroll"><table{id_attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def td(content: str, css: str = "") -> str:
    """A table cell around already-escaped HTML."""
    return f'<td class="{css}">{content}</td>' if css else f"<td>{content}</td>"


def num(value: Any) -> str:
    return td(fmt(value), "num")


def html_table(data: Table, *, table_id: str = "", cells: Mapping[str, Callable[[Any], str]] | None = None) -> str:
    """`data` as an HTML `table`: a value through `cells[its column's header]` where given (which returns its `<td>`),
    else a `Cell` with its class, a number through `num`, text escaped."""
    cells = cells or {}

    def cell(header: str, value: Any) -> str:
        if header in cells:
            return cells[header](value)
        if isinstance(value, Cell):
            text = esc(value.text)
            return td(f'<span class="{esc(value.css)}">{text}</span>') if value.span else td(text, value.css)
        return num(value) if isinstance(value, float) else td(esc(value))

    body = ([cell(h, v) for h, v in zip(data.headers, row)] for row in data.rows)
    return table(data.headers, body, table_id=table_id)


def case_links(anchors: dict[str, str]) -> dict[str, Callable[[str], str]]:
    """`html_table`'s `cells` for a "case" column: each name linking to its case's section."""
    return {"case": lambda case: td(case_link(case, anchors))}


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
    "backend_arithmetic_terms",
    "backend_arithmetic_source",
    "backend_arithmetic",
    "kernel_primitives",
    "jax_version",
    "jaxlib_version",
    "libtpu_version",
    "flax_version",
    "source_accommodations",
    "policy_file",
    "policy_hash",
    "policy_is_default",
)


def sharpness_section(lines: Sequence[dict]) -> str:
    """Per comparison × activation dtype, the bound usage of passing rows; `lines`: the summary's "sharpness"
    records."""
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


def drift_section(judgement: Judgement, anchors: dict[str, str], limit: int) -> str:
    """The gate's judgement in full: every finding and each matched row's growth, or why it refuses the baseline."""
    parts = ['<section id="drift"><h2>Drift against the baseline</h2>']
    gate_result = judgement.result
    if gate_result is None:
        parts += [
            f"<p>The gate refuses to judge this run against {esc(judgement.baseline)}: "
            f"{esc(judgement.refusal)}. <code>mhc-parity gate</code> exits 2 on it; no drift is drawn.</p>",
            "</section>",
        ]
        return "\n".join(parts)
    note = settings_note(gate_result.growth_factor, gate_result.noise_floor_ulps)
    parts += [f"<p>{esc(line)}</p>" for line in ([note] if note else []) + [*judgement.scope, *judgement.remarks]]
    parts += [
        f"<p>{esc(gate_result.summary_line())}</p>",
        "<p>Growth = current ÷ baseline oracle-relative error, both clamped below at "
        f"{esc(format_number(gate_result.noise_floor_ulps))} × eps of the leaf dtype (rounding noise). "
        f"An error fails the gate past its allowance: ×{esc(format_number(gate_result.growth_factor))} "
        "its baseline, or where larger the baseline plus the rounding model's spread of two correct "
        "runs at the policy's stated false-positive rate (√2·q·S; docs/gate.md).</p>",
    ]
    findings = [f for c in FAILING_CATEGORIES + INFO_CATEGORIES for f in gate_result.by_category(c)]
    if findings:
        shown = findings_table(findings[:limit], category=str)  # each category by its own name
        cells = {**case_links(anchors), "detail": lambda detail: td(esc(detail), "reason")}
        parts.append(html_table(shown, table_id="gate-findings-table", cells=cells))
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
                        td(case_link(d.key[0], anchors)),
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
