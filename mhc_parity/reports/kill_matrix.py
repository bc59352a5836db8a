"""The kill matrix's files (CSV, Markdown, JSON) and terminal table, from the plain records of
`mhc_parity.records.kill_records`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import pathlib
from collections.abc import Sequence

from mhc_parity.records.kill_records import (
    DTYPE_SLICES,
    FAULT_COMPARISONS,
    FaultCounts,
    KillMatrix,
    PerturbationResult,
    fault_counts,
)
from mhc_parity.records.rows import encode_float
from mhc_parity.records.text import format_number, format_text_table
from mhc_parity.reports.tables import md_table
from mhc_parity.reports.writers import write_rows_csv


def _caught_by(result: PerturbationResult, comparison: str) -> str:
    """`leaf, leaf (worst usage)` over every slice, for one comparison, or '-'."""
    catches = [c for c in result.catches if c.comparison == comparison]
    if not catches:
        return "-"
    leaves = list(dict.fromkeys(c.leaf for c in sorted(catches, key=lambda c: -_usage_key(c))))
    shown = ", ".join(leaves[:4]) + (f" +{len(leaves) - 4}" if len(leaves) > 4 else "")
    usages = [c.max_bound_usage for c in catches if c.errors < c.rows]
    worst = f"{format_number(max(usages))}x" if usages else "error"
    return f"{shown} ({worst})"


def _usage_key(catch) -> float:
    return float("inf") if catch.errors == catch.rows else catch.max_bound_usage


def _table_rows(results: Sequence[PerturbationResult]):
    for r in results:
        yield [
            r.name,
            r.status,
            *(r.slice(s).cell for s in DTYPE_SLICES),
            *(_caught_by(r, c) for c in FAULT_COMPARISONS),
        ]


def _headers() -> list[str]:
    return ["perturbation", "status", *(f"{s} cases" for s in DTYPE_SLICES), *FAULT_COMPARISONS]


def headline_counts(matrix: KillMatrix) -> list[tuple[str, FaultCounts]]:
    """Faults by outcome over the matrix ("all"), then in each dtype slice that ran a case."""
    slices = [s for s in DTYPE_SLICES if any(r.slice(s).cases_run for r in matrix.results)]
    return [("all", fault_counts(matrix.results)), *((s, fault_counts(matrix.results, s)) for s in slices)]


def _not_caught_lines(results: Sequence[PerturbationResult], statuses: tuple[str, ...]) -> list[str]:
    lines = []
    for r in results:
        for s in r.slices:
            if s.status in statuses:
                why = f" — {s.listed_by}: {s.unkillable_reason}" if s.unkillable_reason else ""
                closest = s.closest.text if s.closest else "no measured row"
                lines.append(f"- `{r.name}`, {s.dtype_slice} ({len(s.cases_run)} cases): closest row {closest}{why}")
    return lines or ["none"]


# The share of a fault's failing rows (per slice) that must name its own cause (issue 67).
OWN_SHARE_TARGET = 0.9


def _share_cell(s) -> str:
    return f"{s.own_cause_rows}/{s.cause_rows} ({s.own_share:.0%})"


def _cause_lines(faults: Sequence[PerturbationResult]) -> list[str]:
    """Per fault and slice with a named cause: rows naming the fault's own cause and a wrong rounding, and the top
    cause; first, those counts over precision and logic faults."""
    pairs = [(r, s) for r in faults for s in r.slices if s.cause_rows]
    lines = []
    for kind, members in (
        ("precision", [p for p in pairs if p[0].causes]),
        ("logic", [p for p in pairs if not p[0].causes]),
    ):
        met = sum(s.own_share >= OWN_SHARE_TARGET for _, s in members)
        own, rows = sum(s.own_cause_rows for _, s in members), sum(s.cause_rows for _, s in members)
        wrong = sum(s.wrong_cause_rows for _, s in members)
        lines.append(
            f"- {kind} faults: the fault's own cause on at least {OWN_SHARE_TARGET:.0%} of the failing rows in "
            f"{met}/{len(members)} (fault, slice) pairs ({own}/{rows} rows); {wrong} rows name a wrong rounding"
        )
    table = [[r.name, s.dtype_slice, _share_cell(s), s.wrong_cause_rows, s.cause_cell] for r, s in pairs]
    headers = ["fault", "dtype slice", "own cause (rows)", "confidently wrong (rows)", "top cause of its failing rows"]
    return [*lines, "", md_table(headers, table)]


def kill_matrix_markdown(matrix: KillMatrix) -> str:
    faults = [r for r in matrix.results if not r.legitimate]
    variants = [r for r in matrix.results if r.legitimate]
    lines = [
        "# Fault kill matrix",
        "",
        *(
            f"Faults: {counts.text}." if label == "all" else f"- {label}: {counts.text}."
            for label, counts in headline_counts(matrix)
        ),
        "",
        f"{sum(r.ok for r in variants)}/{len(variants)} legitimate variants pass; "
        f"{len(matrix.clean_failures)} row(s) fail on the unmodified code.",
        "",
        "A fault is caught in a slice when a row of that slice's cases fails under it; listed when "
        "nothing caught it there and the catalogue lists the slice (its effect is below what the "
        "arithmetic explains there): not seen, and not failing the run. A slice cell: status, cases "
        "caught/run, and the largest bound_usage of a catching row (measured/allowed; >1 fails) or, "
        "where nothing caught, of the closest row. A comparison cell: the leaves whose rows caught "
        "the fault, worst first.",
        "",
        "## Faults",
        "",
        md_table(_headers(), _table_rows(faults)),
        "",
        "## Causes",
        "",
        "What the failing rows under each fault name as their most likely cause "
        "(`mhc_parity.harness.engine.causes`), row by row: a precision fault's own rounding, and for a logic fault "
        "no rounding. Confidently wrong: a row that names a rounding not the fault's own.",
        "",
        *_cause_lines(faults),
        "",
        "## Listed, not seen (effect below what the arithmetic explains in that slice)",
        "",
        *_not_caught_lines(faults, ("listed",)),
        "",
        "## Surviving faults",
        "",
        *_not_caught_lines(faults, ("SURVIVED",)),
        "",
        "## Legitimate variants (must pass)",
        "",
        md_table(_headers(), _table_rows(variants)),
        "",
        "Closest rows under each variant:",
        "",
        *_not_caught_lines(variants, ("passes",)),
    ]
    if matrix.clean_failures:
        lines += [
            "",
            f"**{len(matrix.clean_failures)} row(s) fail on the unmodified code**: a false positive "
            "of the rules (see clean_rows.csv); they cannot count as evidence against any fault.",
        ]
    lines += ["", "## What each perturbation models", ""]
    lines += [f"- `{r.name}` — patches `{r.seams}`: {r.description}" for r in matrix.results]
    return "\n".join(lines) + "\n"


def kill_matrix_text(matrix: KillMatrix) -> str:
    headers = ["perturbation", "status", *DTYPE_SLICES, "caught by (comparison:worst leaf)"]
    body = []
    for r in matrix.results:
        firsts = []
        for comparison in FAULT_COMPARISONS:
            catches = [c for c in r.catches if c.comparison == comparison]
            if catches:
                worst = max(catches, key=_usage_key)
                firsts.append(f"{comparison.removeprefix('vs_')}:{worst.leaf}")
        body.append([r.name, r.status, *(r.slice(s).cell for s in DTYPE_SLICES), " ".join(firsts) or "-"])
    return format_text_table(headers, body)


def _json_number(value: float):
    return encode_float(value)


def kill_matrix_document(matrix: KillMatrix, metadata: dict) -> dict:
    """kill_matrix.json: every perturbation with its per-slice verdicts."""

    def slice_data(s):
        return {
            "dtype_slice": s.dtype_slice,
            "status": s.status,
            "cases_run": list(s.cases_run),
            "cases_caught": list(s.cases_caught),
            "margin": _json_number(s.margin),
            "unkillable_reason": s.unkillable_reason,
            "listed_by": s.listed_by,
            "top_cause": s.top_cause,
            "top_cause_id": s.top_cause_id,
            "top_cause_rows": s.top_cause_rows,
            "cause_rows": s.cause_rows,
            "own_cause": s.own_cause,
            "own_cause_rows": s.own_cause_rows,
            "wrong_cause_rows": s.wrong_cause_rows,
            "closest": None
            if s.closest is None
            else {
                **dataclasses.asdict(s.closest),
                "usage": _json_number(s.closest.usage),
                "clean_usage": _json_number(s.closest.clean_usage),
            },
            "catches": [
                {**dataclasses.asdict(c), "max_bound_usage": _json_number(c.max_bound_usage)} for c in s.catches
            ],
        }

    faults = [r for r in matrix.results if not r.legitimate]

    def counts(dtype_slice=None):
        found = fault_counts(matrix.results, dtype_slice)
        return {"of": found.total, **dict(found.counts), "listed_by": dict(found.listed_by)}

    return {
        "metadata": metadata,
        "ok": matrix.ok,
        "faults": len(faults),
        # Faults that let the run pass: caught or listed in every slice they ran in.
        "faults_ok": sum(r.ok for r in faults),
        # By outcome (`kill_records.OUTCOMES`): caught apart from listed (not seen), over the matrix and per slice.
        "fault_outcomes": counts(),
        "slice_outcomes": {s: counts(s) for s in DTYPE_SLICES},
        "listed": [
            {"name": r.name, "dtype_slice": s.dtype_slice, "listed_by": s.listed_by, "reason": s.unkillable_reason}
            for r in faults
            for s in r.listed_slices
        ],
        "survivors": [r.name for r in faults if not r.ok],
        "false_positives": [r.name for r in matrix.results if r.legitimate and not r.ok],
        "clean_failures": [
            {k: row[k] for k in ("case", "candidate", "partner", "leaf", "verdict", "reason")}
            for row in matrix.clean_failures
        ],
        "results": [
            {
                "name": r.name,
                "seams": r.seams,
                "description": r.description,
                "legitimate": r.legitimate,
                "causes": list(r.causes),
                "status": r.status,
                "outcome": r.outcome,
                "ok": r.ok,
                "ignored_clean_failures": r.ignored_clean_failures,
                "seconds": round(r.seconds, 2),
                "slices": [slice_data(s) for s in r.slices],
            }
            for r in matrix.results
        ],
    }


def _catch_lines(matrix: KillMatrix):
    for r in matrix.results:
        for s in r.slices:
            base = [r.name, "variant" if r.legitimate else "fault", s.dtype_slice, s.status]
            if not s.catches:
                closest = s.closest
                yield base + [
                    "",
                    "",
                    "",
                    0,
                    0,
                    0,
                    "",
                    closest.usage if closest else "",
                    (closest.text if closest else "")
                    + (f" — listed, {s.listed_by}: {s.unkillable_reason}" if s.status == "listed" else ""),
                ]
            for c in s.catches:
                yield base + [
                    c.comparison,
                    c.leaf,
                    c.leaf_kind,
                    c.rows,
                    c.cases,
                    c.errors,
                    c.max_bound_usage,
                    "",
                    f"{c.worst_case} {c.worst_candidate}: {c.worst_reason}",
                ]


CATCH_HEADER = (
    "perturbation",
    "kind",
    "dtype_slice",
    "status",
    "comparison",
    "leaf",
    "leaf_kind",
    "rows_caught",
    "cases_caught",
    "error_rows",
    "max_bound_usage",
    "closest_usage",
    "detail",
)


def write_kill_matrix(matrix: KillMatrix, out: pathlib.Path, metadata: dict) -> dict[str, pathlib.Path]:
    """kill_matrix.csv / .md / .json, clean_rows.csv and perturbed_rows.csv into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out / "kill_matrix.csv",
        "markdown": out / "kill_matrix.md",
        "json": out / "kill_matrix.json",
        "clean rows": out / "clean_rows.csv",
        "perturbed rows": out / "perturbed_rows.csv",
    }
    with paths["csv"].open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CATCH_HEADER)
        writer.writerows(_catch_lines(matrix))
    paths["markdown"].write_text(kill_matrix_markdown(matrix))
    paths["json"].write_text(json.dumps(kill_matrix_document(matrix, metadata), indent=2) + "\n")
    write_rows_csv(paths["clean rows"], [(None, matrix.clean_rows)])
    write_rows_csv(paths["perturbed rows"], matrix.perturbed_rows, label_column="perturbation")
    return paths
