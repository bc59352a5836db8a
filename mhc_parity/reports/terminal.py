"""The one-screen summary printed at the end of a run, and its exit code. With a baseline the gate's verdict
(`judgement`) is printed last and a failing gate fails the run, so `run --baseline` alone is a gate CI can trust.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pandas as pd

from mhc_parity.command_line import colour_wanted, paint_verdicts
from mhc_parity.records.rows import to_frame
from mhc_parity.records.schema import OK_VERDICTS, VERDICTS
from mhc_parity.records.text import format_number, format_text_table, plural
from mhc_parity.reports.causes import (
    ImplementationVerdict,
    cause_groups,
    implementation_of,
    implementation_verdicts,
    uncompared,
)
from mhc_parity.reports.gate.judgement import Judgement, first_findings_table, headline, hidden_findings
from mhc_parity.reports.summary import case_memories, memory_line, sharpness, summary_notes
from mhc_parity.reports.tables import text_table

WORST_ROWS = 12
# A failing run lists its causes, the largest first, each with its first few rows.
MAX_CAUSES = 8
ROWS_PER_CAUSE = 3


def run_verdict(rows, implementations: Sequence[str] = ()) -> str:
    """ "FAIL" on any fail/error row, else "NOTHING COMPARED" when nothing of what it tests compared
    (`uncompared`), else "PASS"."""
    if any(r["verdict"] not in OK_VERDICTS for r in rows):
        return "FAIL"
    if uncompared(rows, implementations):
        return "NOTHING COMPARED"
    return "PASS"


def exit_code(
    rows, judgement: Judgement | None = None, implementations: Sequence[str] = (), *, whole_run: bool = True
) -> int:
    """0 PASS, 1 FAIL, 2 NOTHING COMPARED (a configuration error). A pass the gate fails exits 1; a baseline the gate
    refuses exits 2, as `mhc-parity gate` does (`run --baseline` must not go green ungated). A shard (`whole_run=False`)
    that compared nothing exits as its rows say: `merge` checks the whole."""
    verdict = run_verdict(rows, implementations)
    code = {"PASS": 0, "FAIL": 1}.get(verdict, 0 if not whole_run else 2)
    if judgement is not None and judgement.result is None:
        return 2
    if code == 0 and judgement is not None and judgement.failed:
        return 1
    return code


def nothing_compared_message(rows, implementations: Sequence[str] = ()) -> str:
    missing = uncompared(rows, implementations)
    if missing == ["the run"]:
        reasons = list(dict.fromkeys(r["reason"] for r in rows if r["reason"]))
        example = f" (e.g. {reasons[0]})" if reasons else ""
        return (
            f"nothing was compared: all {len(rows)} rows are skip/unsupported{example}; "
            "select paths and cases that run on this machine"
        )
    name = missing[0]
    own = [r for r in rows if implementation_of(str(r["candidate"])) == name]
    reasons = list(dict.fromkeys(r["reason"] for r in own if r["reason"]))
    what = f"its {len(own)} rows are skip/unsupported" if own else "it has no rows (no variant or path of it ran)"
    example = f" (e.g. {reasons[0]})" if reasons else ""
    more = f" (nor of {', '.join(map(repr, missing[1:]))})" if len(missing) > 1 else ""
    return (
        f"nothing was compared of implementation {name!r}{more}: {what}{example}; "
        "select cases inside its envelope and variants it serves"
    )


def _usage_key(row) -> float:
    usage = row.get("bound_usage", math.nan)
    return -1.0 if usage is None or (isinstance(usage, float) and math.isnan(usage)) else float(usage)


def rows_table(rows, *, indent: str = "", limit: int | None = 120) -> str:
    """Rows as a text table: verdict, bound usage, case, candidate vs partner, leaf, reason or bound."""
    body = [
        [
            r["verdict"],
            format_number(r["bound_usage"], nan="-"),
            r["case"],
            f"{r['candidate']} vs {r['partner']}",
            r["leaf"],
            r["reason"] or r["bound"],
        ]
        for r in rows
    ]
    return format_text_table(
        ["verdict", "usage", "case", "compared", "leaf", "reason / bound"], body, indent=indent, limit=limit
    )


def format_summary(
    rows,
    metadata=None,
    judgement: Judgement | None = None,
    *,
    frame: pd.DataFrame | None = None,
    implementations: Sequence[str] = (),
) -> str:
    """Verdict counts per comparison, the failures by cause (or the rows closest to their bound), sharpness, host
    memory, the summary notes, the verdict; last the gate's lines with a baseline. frame: the rows' canonical frame,
    where the caller has one."""
    by_comparison: dict[str, Counter] = {}
    for r in rows:
        by_comparison.setdefault(r["comparison"] or "-", Counter())[r["verdict"]] += 1
    total = Counter(r["verdict"] for r in rows)
    counts = [
        [comparison, *(counts.get(v, 0) for v in VERDICTS)] for comparison, counts in sorted(by_comparison.items())
    ]
    lines = [format_text_table(["comparison", *VERDICTS], [*counts, ["total", *(total.get(v, 0) for v in VERDICTS)]])]
    bad = [r for r in rows if r["verdict"] not in OK_VERDICTS]
    if bad:
        groups = cause_groups(bad)
        lines += ["", f"{plural(len(bad), 'row')} failed, from {plural(len(groups), 'cause')}:"]
        for group in groups[:MAX_CAUSES]:
            lines += ["", f"  {group.heading()}", rows_table(group.rows[:ROWS_PER_CAUSE], indent="    ")]
        if len(groups) > MAX_CAUSES:
            lines += ["", f"  ... and {plural(len(groups) - MAX_CAUSES, 'more cause')} (report.json has them all)"]
    else:
        lines += ["", "closest to their bound:"]
        shown = sorted((r for r in rows if r["verdict"] == "pass"), key=_usage_key, reverse=True)[:WORST_ROWS]
        lines.append(rows_table(shown, indent="  "))
    lines += ["", "sharpness (bound usage of passing rows; 1.0 = at the bound):", sharpness_text(rows, frame)]
    memory = memory_line(case_memories(rows))
    if memory:
        lines += ["", memory]
    for note in summary_notes(metadata):
        lines += ["", note]
    verdicts = " · ".join(implementation_line(v) for v in implementation_verdicts(rows))
    verdict = run_verdict(rows, implementations)
    lines += ["", f"parity: {verdict} ({len(rows)} rows)" + (f": {verdicts}" if verdicts else "")]
    if judgement is not None:
        lines += gate_lines(judgement)
    return "\n".join(lines)


def gate_lines(judgement: Judgement) -> list[str]:
    """The gate's headline, scope and remarks, and its first failing findings."""
    lines = [headline(judgement), *(f"  {line}" for line in (*judgement.scope, *judgement.remarks))]
    result = judgement.result
    if result is not None and not result.ok:
        lines.append(text_table(first_findings_table(result), indent="  "))
        more = hidden_findings(result)
        if more:
            lines.append(f"  ... and {more} more failing findings (report.html, `mhc-parity gate`)")
    return lines


def implementation_line(verdict: ImplementationVerdict) -> str:
    """e.g. "interpret FAIL (forward passes; first fails in pre_backward (d_pre_bias); 2 causes)",
    "reference pass"."""
    if verdict.verdict in ("pass", "skip"):
        return f"{verdict.name} {verdict.verdict}"
    where = f"{verdict.where}; " if verdict.where else ""
    return f"{verdict.name} {verdict.verdict.upper()} ({where}{plural(len(verdict.groups), 'cause')})"


def sharpness_text(rows, frame: pd.DataFrame | None = None) -> str:
    """Per comparison × activation dtype, passing rows and median / p90 / max bound usage; frame: the rows' canonical
    frame where the caller has it."""
    if frame is None and rows:
        frame = to_frame(list(rows), source="run rows")
    table = sharpness(frame) if frame is not None else None
    if table is None or not len(table):
        return "  (no bounded rows)"
    body = [
        [
            r.comparison,
            r.act_dtype,
            r.passing,
            *(format_number(v, 2) for v in (r.median_usage, r.p90_usage, r.max_usage)),
        ]
        for r in table.itertuples()
    ]
    return format_text_table(["comparison", "act dtype", "passing", "median", "p90", "max"], body, indent="  ")


def print_summary(
    rows,
    metadata=None,
    judgement: Judgement | None = None,
    *,
    frame: pd.DataFrame | None = None,
    implementations: Sequence[str] = (),
) -> None:
    text = format_summary(rows, metadata, judgement, frame=frame, implementations=implementations)
    print(paint_verdicts(text) if colour_wanted() else text)
