"""The false-positive sweep's headroom table and its files (CSV, Markdown, JSON) and terminal table.

`harness.faults.seed_sweep` runs the unmodified code over many seeds; this module measures,
per (comparison, dtype, leaf kind), how close the passing rows came to their bounds
(`reports.summary.usage_groups`) and writes it.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Sequence

from records.kill_records import CATCHING_VERDICTS
from records.rows import encode_float, json_ready, to_frame
from records.text import format_number, format_text_table
from reports.markdown import md_table
from reports.summary import usage_groups
from reports.writers import write_rows_csv

HEADROOM_KEYS = ["comparison", "dtype", "leaf_kind"]


def headroom_table(rows: Sequence[dict]):
    """Per (comparison, dtype, leaf kind): counts and bound-usage figures (a DataFrame)."""
    return usage_groups(to_frame(list(rows), source="sweep rows"), HEADROOM_KEYS)


def sweep_markdown(table, failures: Sequence[dict], seeds: int, case_count: int) -> str:
    """The sweep as Markdown: the headroom table, then the failing rows."""
    body = [
        [
            r.comparison,
            r.dtype,
            r.leaf_kind,
            r.passing,
            r.failing,
            format_number(r.median_usage),
            format_number(r.p90_usage),
            format_number(r.max_usage),
            f"{r.closest_case} {r.closest_candidate} {r.closest_leaf}".strip() or "-",
        ]
        for r in table.itertuples()
    ]
    lines = [
        "# False-positive sweep",
        "",
        f"Unmodified code, {case_count} case(s) x seeds 0..{seeds - 1}. Bound usage of the passing rows "
        "(median, 90th percentile, largest; 1.0 = at the bound).",
        "",
        md_table(
            ["comparison", "dtype", "leaf kind", "passing", "failing", "median", "p90", "max", "closest row"],
            body,
            numeric=[False, False, False, True, True, True, True, True, False],
        ),
        "",
        f"## Failing rows ({len(failures)})",
        "",
    ]
    for row in failures[:200]:
        lines.append(
            f"- {row['verdict']} `{row['case']}` {row['candidate']} {row['comparison']} `{row['leaf']}` "
            f"usage {row['bound_usage']}: {' '.join(str(row['reason']).split())}"
        )
    if not failures:
        lines.append("none")
    return "\n".join(lines) + "\n"


def sweep_text(table) -> str:
    """The headroom table for the terminal."""
    return format_text_table(
        ["comparison", "dtype", "leaf kind", "pass", "fail", "median", "p90", "max", "closest row"],
        [
            [
                r.comparison,
                r.dtype,
                r.leaf_kind,
                r.passing,
                r.failing,
                format_number(r.median_usage),
                format_number(r.p90_usage),
                format_number(r.max_usage),
                f"{r.closest_case} {r.closest_leaf}".strip(),
            ]
            for r in table.itertuples()
        ],
    )


def write_sweep(
    table, rows: Sequence[dict], seeds: int, cases: Sequence, out: pathlib.Path, wall_seconds: float
) -> dict[str, pathlib.Path]:
    """headroom.csv, failures.csv, sweep.md and sweep.json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    failures = [r for r in rows if r["verdict"] in CATCHING_VERDICTS]
    paths = {
        "headroom": out / "headroom.csv",
        "failures": out / "failures.csv",
        "markdown": out / "sweep.md",
        "json": out / "sweep.json",
    }
    table.to_csv(paths["headroom"], index=False, lineterminator="\n", na_rep=encode_float(math.nan))
    write_rows_csv(paths["failures"], [(None, failures)])
    paths["markdown"].write_text(sweep_markdown(table, failures, seeds, len(cases)))
    paths["json"].write_text(
        json.dumps(
            json_ready(
                {
                    "seeds": seeds,
                    "cases": [c.name for c in cases],
                    "rows": len(rows),
                    "failing_rows": len(failures),
                    "wall_seconds": round(wall_seconds, 1),
                    "headroom": table.to_dict(orient="records"),
                }
            ),
            indent=2,
            allow_nan=False,
        )
        + "\n"
    )
    return paths
