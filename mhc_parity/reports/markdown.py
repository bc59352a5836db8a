"""Markdown summaries for a PR comment or a CI step summary (GitHub tables). Every cell from a row goes through
`md_cell`, so a hostile case name can neither break a table nor inject markup.
"""

from __future__ import annotations

import html

import pandas as pd

from mhc_parity.records.cause_consistency import consistent_causes
from mhc_parity.records.schema import VERDICTS, row_key
from mhc_parity.records.text import format_number
from mhc_parity.reports.causes import format_heading
from mhc_parity.reports.gate.drift import settings_note
from mhc_parity.reports.gate.judgement import FAIL, PASS, Judgement, first_findings_table, headline, hidden_findings
from mhc_parity.reports.gate.rule import FAILING_CATEGORIES, INFO_CATEGORIES, GateResult, findings_table, spaced
from mhc_parity.reports.speed import (
    PROGRAM_SPEED_NOTE,
    SPEED_NOTE,
    program_speed_table,
    program_speeds,
    speed_lines,
    speed_summaries,
    speedup_table,
)
from mhc_parity.reports.summary import (
    FAILING_VERDICTS,
    case_memories,
    memory_line,
    memory_table,
    rank_offenders,
    summarize,
    summary_notes,
)
from mhc_parity.reports.tables import markdown_table, md_cell, md_table

DEFAULT_MAX_ROWS = 20
# Metadata keys of the one-line environment footer, when present.
ENVIRONMENT_KEYS = (
    "run_id",
    "run_state",
    "git_commit",
    "backend",
    "device_kind",
    "device_count",
    "matmul_precision",
    "jax_version",
)


# Causes listed per implementation; report.json has them all.
MAX_CAUSES = 8


def markdown_heading(group: dict) -> str:
    """A cause group's heading in Markdown: names as code spans (backticks inside dropped), the cause escaped."""
    return format_heading(group, quote=lambda name: f"`{md_cell(name, None).replace(chr(92) + '`', '')}`", text=md_cell)


def _truncation_note(shown: int, total: int, where: str) -> list[str]:
    return ["", f"… and {total - shown} more ({where})."] if total > shown else []


def gate_markdown(result: GateResult, *, max_rows: int = DEFAULT_MAX_ROWS) -> str:
    status = "✅ PASS" if result.ok else "❌ FAIL"
    lines = [
        f"### Baseline gate: {status}",
        "",
        f"{result.current_rows} current rows vs {result.baseline_rows} baseline rows "
        f"({result.matched_rows} matched); fails when an oracle-relative error grows by more than "
        f"×{result.growth_factor:g} above a noise floor of {result.noise_floor_ulps:g} ulps.",
    ]
    note = settings_note(result.growth_factor, result.noise_floor_ulps)
    if note:
        lines[1:1] = ["", f"> {note}"]
    for category in FAILING_CATEGORIES + INFO_CATEGORIES:
        findings = result.by_category(category)
        if not findings:
            continue
        if category == "missing":  # per case and path: a partial run misses whole groups
            groups = result.missing_table()
            lines += ["", f"**{result.missing_heading()}**", ""]
            lines.append(markdown_table(groups.head(max_rows)))
            lines += _truncation_note(min(len(groups.rows), max_rows), len(groups.rows), "see the gate output")
            continue
        shown = findings[:max_rows]
        lines += ["", f"**{spaced(category)} ({len(findings)})**", ""]
        if category == "failure" and result.failure_causes:
            lines += [f"- {markdown_heading(g.summary())}" for g in result.failure_causes[:MAX_CAUSES]] + [""]
        lines.append(markdown_table(findings_table(shown)))
        lines += _truncation_note(len(shown), len(findings), "see the gate output")
    return "\n".join(lines) + "\n"


VERDICT_MARKS = {PASS: "✅", FAIL: "❌"}  # a refused baseline: ⚠️


def first_screen_gate_lines(judgement: Judgement) -> list[str]:
    """The gate's verdict for the top of the summary: headline, scope and remarks, first failing findings."""
    mark = VERDICT_MARKS.get(judgement.verdict, "⚠️")
    lines = [f"{mark} **{md_cell(headline(judgement), None)}**"]
    lines += [f"- {md_cell(line, None)}" for line in (*judgement.scope, *judgement.remarks)]
    result = judgement.result
    if result is None or result.ok:
        return lines
    lines += ["", markdown_table(first_findings_table(result))]
    more = hidden_findings(result)
    return lines + (["", f"… and {more} more failing findings (see the baseline gate below)."] if more else [])


def judgement_markdown(judgement: Judgement, *, max_rows: int = DEFAULT_MAX_ROWS) -> str:
    """The gate section at the foot of the summary, or why the gate refuses the baseline."""
    if judgement.result is not None:
        return gate_markdown(judgement.result, max_rows=max_rows)
    return (
        "### Baseline gate: ⚠️ NOT JUDGED\n\n"
        f"The gate refuses to judge this run against {md_cell(judgement.baseline, None)}: "
        f"{md_cell(judgement.refusal, None)} (`mhc-parity gate` exits 2 on it).\n"
    )


def _implementation_lines(summary: dict) -> list[str]:
    lines = ["", "### Verdict per implementation", ""]
    for impl in summary.get("implementations", []):
        where = f" — {md_cell(impl['where'])}" if impl.get("where") else ""
        lines.append(f"- **{md_cell(impl['name'])}**: {impl['verdict'].upper()}{where}")
        lines += [f"  - {markdown_heading(c)}" for c in impl["causes"][:MAX_CAUSES]]
        if len(impl["causes"]) > MAX_CAUSES:
            lines.append(f"  - ... and {len(impl['causes']) - MAX_CAUSES} more causes (see report.json)")
    return lines


def _declared_choice_lines(metadata: dict | None) -> list[str]:
    """Each implementation's declared precision choices with the backend probe they rest on (nothing if none)."""
    declared = (metadata or {}).get("precision_choices") or {}
    if not declared:
        return []
    lines = ["", "### Declared precision choices", ""]
    for name, choices in declared.items():
        lines.append(f"- **{md_cell(name)}**")
        lines += [f"  - {md_cell(choice, None)}" for choice in choices]
    if metadata.get("backend_probe"):
        lines += ["", f"Backend probe: {md_cell(metadata['backend_probe'], None)}"]
    return lines


def _accommodation_lines(metadata: dict | None) -> list[str]:
    record = (metadata or {}).get("source_accommodations")
    if not record:
        return []
    return ["", f"**Source accommodation applied**: {md_cell(record, None)}"]


def _speed_lines(frame: pd.DataFrame, max_rows: int, metadata: dict | None = None) -> list[str]:
    """The folded Speed section: the first `max_rows` programs against the chip's peak, then the speed-ups against the
    reference; nothing where no program was timed."""
    speeds = program_speeds(frame, metadata)
    if not speeds:
        return []
    out = ["", md_cell(PROGRAM_SPEED_NOTE, None), ""]
    out.append(markdown_table(program_speed_table(speeds).head(max_rows)))
    out += _truncation_note(min(len(speeds), max_rows), len(speeds), "see speed.csv")
    lines = speed_lines(frame)
    if not lines:
        return _folded(_speed_title(len(speeds), metadata), out)
    out += ["", md_cell(SPEED_NOTE, None), ""]
    out += [f"- {md_cell(summary.text, None)}" for summary in speed_summaries(lines)]
    out += ["", markdown_table(speedup_table(lines).head(max_rows))]
    return _folded(
        _speed_title(len(speeds), metadata),
        out + _truncation_note(min(len(lines), max_rows), len(lines), "see report.html"),
    )


def _speed_title(programs: int, metadata: dict | None) -> str:
    where = " on a CPU: not a speed measurement" if (metadata or {}).get("backend") == "cpu" else ""
    return f"Speed: {programs} program{'s' * (programs != 1)} timed{where}"


def _folded(title: str, lines: list[str]) -> list[str]:
    """`lines` inside a closed `<details>` (a PR comment leads with the verdict); the blank lines let GitHub render
    tables inside."""
    body = lines[1:] if lines and lines[0] == "" else lines
    return ["", f"<details><summary>{md_cell(title, None)}</summary>", "", *body, "", "</details>"]


def _rerun_lines(rerun: str) -> list[str]:
    if not rerun:
        return []
    # <pre><code>, escaped: copied as it is, and a hostile case name injects no markup.
    return ["", "Rerun only the failing cases:", "", f"<pre><code>{html.escape(rerun)}</code></pre>"]


def _memory_lines(frame: pd.DataFrame) -> list[str]:
    columns = ("case", "oracle_peak_bytes", "oracle_budget_bytes")
    if not set(columns) <= set(frame.columns):
        return []
    memories = case_memories(frame[list(columns)].to_dict(orient="records"))
    if not memories:
        return []
    return _folded(
        "Host memory",
        [
            md_cell(memory_line(memories), None),
            "",
            markdown_table(memory_table(memories)),
        ],
    )


def render_markdown(
    frame: pd.DataFrame,
    *,
    summary: dict | None = None,
    metadata: dict | None = None,
    judgement: Judgement | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
    rerun: str = "",
) -> str:
    """The run summary (summary.md), verdict first: status, policy and backend-terms notes, the gate's verdict, failures
    and the `rerun` command; then counts, worst leaf, implementations; speed and host memory folded; the gate's section;
    the environment. frame: a canonical row frame; summary: computed if not given."""
    summary = summarize(frame) if summary is None else summary
    counts = summary["verdicts"]
    if summary["ok"] and (judgement is None or not judgement.failed):
        status = "✅ PASS"
    elif summary["uncompared"] and not any(counts[v] for v in FAILING_VERDICTS):
        status = "⚠️ NOTHING COMPARED"  # nothing of the run, or of an implementation, compared: never a pass
    else:
        status = "❌ FAIL"
    lines = [f"## mHC parity: {status}", ""]
    for note in summary_notes(metadata):
        lines += [f"> ⚠️ {md_cell(note, None)}", ""]
    if judgement is not None:
        lines += [*first_screen_gate_lines(judgement), ""]
    if not summary["total"]:
        lines.append("No rows were produced.")
    else:
        lines.append(f"{summary['total']} rows over {summary['cases']} cases.")
    lines += _failure_lines(frame, max_rows)
    lines += _rerun_lines(rerun)
    lines += [
        "",
        md_table(
            (*VERDICTS, "total"),
            [(*(counts[v] for v in VERDICTS), summary["total"])],
            numeric=[True] * (len(VERDICTS) + 1),
        ),
    ]
    worst = summary["worst_leaf"]
    if worst:
        lines += [
            "",
            f"Worst leaf by bound usage: {md_cell(worst['case'])} · {md_cell(worst['candidate'])} vs "
            f"{md_cell(worst['partner'])} · {md_cell(worst['leaf'])} — "
            f"{format_number(worst['bound_usage'])} of its bound ({md_cell(worst['verdict'])}).",
        ]
    lines += _implementation_lines(summary)
    lines += _declared_choice_lines(metadata)
    lines += _accommodation_lines(metadata)
    lines += _speed_lines(frame, max_rows, metadata)
    lines += _memory_lines(frame)
    if judgement is not None:
        lines += ["", judgement_markdown(judgement, max_rows=max_rows).rstrip("\n")]
    environment = [
        f"{key}: {md_cell(metadata[key])}"
        for key in ENVIRONMENT_KEYS
        if metadata and metadata.get(key) not in (None, "")
    ]
    if environment:
        lines += ["", "<sub>" + " · ".join(environment) + "</sub>"]
    return "\n".join(lines) + "\n"


def _failure_lines(frame: pd.DataFrame, max_rows: int) -> list[str]:
    """The first `max_rows` fail and error rows, worst first, each with its cause as stated across its implementation
    (`consistent_causes`)."""
    failing = rank_offenders(frame)
    failing = failing[failing["verdict"].isin(("fail", "error"))]
    if not len(failing):
        return []
    shown = failing.head(max_rows)
    failed = frame[frame["verdict"] == "fail"].to_dict(orient="records")
    stated = {row_key(r): r["cause"] for r in consistent_causes(failed)}
    lines = ["", f"### Failures ({len(failing)})", ""]
    lines.append(
        md_table(
            ("case", "candidate", "partner", "leaf", "verdict", "bound usage", "cause", "reason"),
            [
                (
                    r["case"],
                    r["candidate"],
                    r["partner"],
                    r["leaf"],
                    r["verdict"],
                    format_number(r["bound_usage"]),
                    stated.get(row_key(r), r["cause"]),
                    r["reason"],
                )
                for r in shown.to_dict(orient="records")
            ],
        )
    )
    return lines + _truncation_note(len(shown), len(failing), "see report.html")
