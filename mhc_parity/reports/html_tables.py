"""The HTML report's tables: sharpness, worst offenders, drift, speed, per-case detail, environment. All row and
metadata text goes through `esc`; case names link through generated anchors.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pandas as pd

from mhc_parity.records.schema import VERDICTS
from mhc_parity.records.text import format_number
from mhc_parity.reports.figure_store import figure_svg
from mhc_parity.reports.gate.drift import settings_note
from mhc_parity.reports.gate.judgement import Judgement
from mhc_parity.reports.gate.rule import FAILING_CATEGORIES, INFO_CATEGORIES, findings_table
from mhc_parity.reports.html_elements import case_link, esc, html_table, num, table, td, verdict_span
from mhc_parity.reports.program_speed import (
    NO_PEAK,
    PROGRAM_SPEED_NOTE,
    program_speed_table,
    program_speeds,
    roofline_figure,
)
from mhc_parity.reports.speed import SPEED_NOTE, speed_lines, speed_summaries, speedup_table
from mhc_parity.reports.summary import FAILING_VERDICTS, rank_offenders

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
        cells = {"case": lambda case: td(case_link(case, anchors)), "detail": lambda detail: td(esc(detail), "reason")}
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
    parts.append(html_table(speedup_table(lines), table_id="speed-table", cells=_case_links(anchors)))
    parts.append("</section>")
    return "\n".join(parts)


def _case_links(anchors: dict[str, str]) -> dict:
    return {"case": lambda case: td(case_link(case, anchors))}


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
    parts.append(html_table(program_speed_table(speeds), table_id="program-speed-table", cells=_case_links(anchors)))
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
