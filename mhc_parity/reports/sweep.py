"""The false-positive sweep's files: per (comparison, dtype, leaf kind) how close the unmodified code's passing rows
came to their bounds (`usage_groups`), and per init family too the usage tail against the policy's stated rate
(`calibration_table`).
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from mhc_parity.records.kill_records import CATCHING_VERDICTS
from mhc_parity.records.rows import encode_float, json_ready, to_frame
from mhc_parity.records.text import format_number, format_text_table
from mhc_parity.reports.summary import BOUNDED_COMPARISONS, usage_groups
from mhc_parity.reports.tables import md_table
from mhc_parity.reports.writers import write_rows_csv

HEADROOM_KEYS = ["comparison", "dtype", "leaf_kind"]
CALIBRATION_KEYS = [*HEADROOM_KEYS, "init"]
# The usage levels whose exceedance the calibration counts (1.0: a failing row).
TAIL_LEVELS = (0.5, 0.8, 1.0)
# Poisson upper quantile past which a cell's count above 1.0 is inconsistent with the stated rate.
TAIL_CONFIDENCE = 0.999
CALIBRATION_COLUMNS = [
    *CALIBRATION_KEYS,
    "rows",
    "median_usage",
    "p90_usage",
    "p99_usage",
    "max_usage",
    *(f"above_{level:g}" for level in TAIL_LEVELS),
    "expected_above_1",
    "tail",
]


def headroom_table(rows: Sequence[dict]):
    return usage_groups(to_frame(list(rows), source="sweep rows"), HEADROOM_KEYS)


def calibration_table(rows: Sequence[dict], families: Mapping[str, str], false_positive_rate: float | None):
    """Per (comparison, dtype, leaf kind, init family) of the bounded rows: count, usage quantiles (failing rows
    included), fraction above each `TAIL_LEVELS`, the count above 1.0 expected at the stated rate (NaN without one) and
    whether the observed count is within its `TAIL_CONFIDENCE` Poisson quantile. families: case -> init family."""
    frame = to_frame(list(rows), source="sweep rows")
    bounded = frame[
        frame["comparison"].isin(BOUNDED_COMPARISONS)
        & frame["verdict"].isin(["pass", *CATCHING_VERDICTS])
        & frame["bound_usage"].notna()
    ].copy()
    bounded["init"] = [families.get(str(case), "") for case in bounded["case"]]
    lines = []
    for values, group in bounded.groupby(CALIBRATION_KEYS, sort=True):
        usage = group["bound_usage"].astype(float).replace(np.inf, np.finfo(float).max)
        count = len(usage)
        above = {level: int((usage > level).sum()) for level in TAIL_LEVELS}
        expected = math.nan if false_positive_rate is None else count * false_positive_rate
        if math.isnan(expected):
            tail = "-"
        else:
            allowed = stats.poisson.ppf(TAIL_CONFIDENCE, expected)
            tail = "consistent" if above[1.0] <= allowed else "above the stated rate"
        lines.append(
            {
                **dict(zip(CALIBRATION_KEYS, values)),
                "rows": count,
                "median_usage": float(usage.median()),
                "p90_usage": float(usage.quantile(0.9)),
                "p99_usage": float(usage.quantile(0.99)),
                "max_usage": float(usage.max()),
                **{f"above_{level:g}": above[level] / count for level in TAIL_LEVELS},
                "expected_above_1": expected,
                "tail": tail,
            }
        )
    return pd.DataFrame(lines, columns=CALIBRATION_COLUMNS)


def calibration_markdown(calibration, false_positive_rate: float | None) -> list[str]:
    rate = "no stated rate" if false_positive_rate is None else f"stated rate {false_positive_rate:g} per row"
    body = [
        [
            *(r[key] or "-" for key in CALIBRATION_KEYS),
            r["rows"],
            *(format_number(r[f"{q}_usage"]) for q in ("median", "p90", "p99", "max")),
            *(format_number(r[f"above_{level:g}"]) for level in TAIL_LEVELS),
            format_number(r["expected_above_1"]),
            r["tail"],
        ]
        for r in calibration.to_dict(orient="records")
    ]
    return [
        "## Calibration",
        "",
        f"Per comparison, dtype, leaf kind and init family ({rate}): bound usage of every bounded row "
        "(failing ones included), the fraction of rows above 0.5, 0.8 and 1.0, and the rows above 1.0 a correct "
        f"implementation would show at the stated rate; 'consistent' when the observed count is within its "
        f"{TAIL_CONFIDENCE:g} Poisson quantile.",
        "",
        md_table(
            [
                "comparison",
                "dtype",
                "leaf kind",
                "init",
                "rows",
                "median",
                "p90",
                "p99",
                "max",
                *(f"> {level:g}" for level in TAIL_LEVELS),
                "expected > 1",
                "tail",
            ],
            body,
            numeric=[False] * 4 + [True] * (9 + len(TAIL_LEVELS) - 3) + [False],
        ),
        "",
    ]


def sweep_markdown(
    table,
    failures: Sequence[dict],
    seeds: int,
    case_count: int,
    calibration=None,
    false_positive_rate: float | None = None,
) -> str:
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
        *([] if calibration is None else calibration_markdown(calibration, false_positive_rate)),
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
    table,
    rows: Sequence[dict],
    seeds: int,
    cases: Sequence,
    out: pathlib.Path,
    wall_seconds: float,
    *,
    families: Mapping[str, str] | None = None,
    false_positive_rate: float | None = None,
) -> dict[str, pathlib.Path]:
    """headroom.csv, calibration.csv, failures.csv, rows.csv (every row), sweep.md and sweep.json into `out`. families:
    seeded case -> init family."""
    out.mkdir(parents=True, exist_ok=True)
    failures = [r for r in rows if r["verdict"] in CATCHING_VERDICTS]
    calibration = calibration_table(rows, families or {}, false_positive_rate)
    paths = {
        "headroom": out / "headroom.csv",
        "calibration": out / "calibration.csv",
        "failures": out / "failures.csv",
        "rows": out / "rows.csv",
        "markdown": out / "sweep.md",
        "json": out / "sweep.json",
    }
    table.to_csv(paths["headroom"], index=False, lineterminator="\n", na_rep=encode_float(math.nan))
    calibration.to_csv(paths["calibration"], index=False, lineterminator="\n", na_rep=encode_float(math.nan))
    write_rows_csv(paths["failures"], [(None, failures)])
    write_rows_csv(paths["rows"], [(None, rows)])
    paths["markdown"].write_text(sweep_markdown(table, failures, seeds, len(cases), calibration, false_positive_rate))
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
                    "false_positive_rate": false_positive_rate,
                    "calibration": calibration.to_dict(orient="records"),
                }
            ),
            indent=2,
            allow_nan=False,
        )
        + "\n"
    )
    return paths
