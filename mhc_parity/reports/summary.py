"""Run summaries: verdict counts, the worst leaf, the worst-offenders ordering, the bound usage per group (sharpness),
the notes every summary opens with, and host memory: each case's float64 oracle, run in a process of its own, its
measured peak (`oracle_peak_bytes`) against the case-memory estimate's budget (`oracle_budget_bytes`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import pandas as pd

from mhc_parity.records.environment import BACKEND_SOURCE_KEY, BACKEND_TERMS_KEY, NO_BACKEND_TERMS
from mhc_parity.records.schema import COMPARED_VERDICTS, IDENTITY_COLUMNS, OK_VERDICTS, VERDICTS
from mhc_parity.reports.causes import CAUSE_COLUMNS, cause_groups, implementation_verdicts, uncompared
from mhc_parity.reports.tables import Column, Table

# Verdicts that break a run (exit code 1 / gate failure).
FAILING_VERDICTS = tuple(v for v in VERDICTS if v not in OK_VERDICTS)
# Verdicts with no measurement behind them.
UNMEASURED_VERDICTS = ("skip", "unsupported")
# Whether the packaged tolerance policy judged the run (absent in older runs).
POLICY_IS_DEFAULT_KEY = "policy_is_default"


def policy_note(metadata) -> str:
    """The sentence every summary opens with when a policy other than the packaged one judged the run (a PASS under
    loosened bounds must not read as a default one); "" otherwise or if unrecorded."""
    if not metadata or metadata.get(POLICY_IS_DEFAULT_KEY) is not False:
        return ""
    return (
        f"Tolerance policy {metadata.get('policy_file') or '(file not recorded)'} "
        f"(sha256 {metadata.get('policy_hash') or 'not recorded'}) is not the packaged default: "
        "the bounds that judged this run differ from the defaults."
    )


def backend_terms_note(metadata) -> str:
    """The sentence every summary opens with when non-zero backend arithmetic terms judged the run: its bounds are wider
    than a CPU's, so its PASS must not read as one (docs/backend-arithmetic.md); "" otherwise."""
    terms = (metadata or {}).get(BACKEND_TERMS_KEY)
    if not terms or terms == NO_BACKEND_TERMS:
        return ""
    backend = f"{metadata.get('backend') or 'unrecorded backend'} ({metadata.get('device_kind') or '?'})"
    source = metadata.get(BACKEND_SOURCE_KEY) or "a probe table not recorded"
    return (
        f"Backend arithmetic terms widened this run's bounds: {terms} on {backend}, from {source}. "
        "XLA:CPU's primitives get none: an error within these terms passes here and fails a CPU's "
        "bounds (docs/backend-arithmetic.md)."
    )


def summary_notes(metadata) -> list[str]:
    """The non-empty `policy_note` and `backend_terms_note` of `metadata`."""
    return [note for note in (policy_note(metadata), backend_terms_note(metadata)) if note]


def verdict_counts(frame: pd.DataFrame) -> dict[str, int]:
    """Rows per verdict, every schema verdict present (zeros included), in schema order."""
    counts = frame["verdict"].value_counts() if len(frame) else pd.Series(dtype="int64")
    return {verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}


def rank_offenders(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured rows (no skip or unsupported), worst first: error, fail, then bound_usage descending (+inf first, NaN
    last within its verdict)."""
    measured = frame[~frame["verdict"].isin(UNMEASURED_VERDICTS)].copy()
    severity = {"error": 0, "fail": 1}
    measured["_severity"] = measured["verdict"].map(lambda v: severity.get(v, 2))
    measured["_usage"] = measured["bound_usage"].fillna(-math.inf)
    ordered = measured.sort_values(
        ["_severity", "_usage", *IDENTITY_COLUMNS],
        ascending=[True, False, True, True, True, True],
        kind="mergesort",
    )
    return ordered.drop(columns=["_severity", "_usage"])


def worst_leaf(frame: pd.DataFrame) -> dict | None:
    """The row with the largest bound_usage (NaN ignored) as a small dict, or None."""
    usage = frame["bound_usage"]
    if not len(frame) or usage.isna().all():
        return None
    row = frame.loc[usage.fillna(-math.inf).idxmax()]
    return {
        "case": row["case"],
        "candidate": row["candidate"],
        "partner": row["partner"],
        "leaf": row["leaf"],
        "comparison": row["comparison"],
        "dtype": row["dtype"],
        "verdict": row["verdict"],
        "bound_usage": float(row["bound_usage"]),
        "bound": row["bound"],
    }


def summarize(frame: pd.DataFrame, implementations: Sequence[str] = ()) -> dict:
    """The run's summary: totals, verdict counts (overall and per comparison), worst leaf, sharpness, implementations
    and causes. `ok`: no fail or error row, and something compared of everything under test (`uncompared` of
    `implementations`): a run that checked nothing never passes."""
    counts = verdict_counts(frame)
    by_comparison = (
        {comparison: verdict_counts(group) for comparison, group in frame.groupby("comparison", sort=True)}
        if len(frame)
        else {}
    )
    nonfinite = int(((frame["nan_count"] > 0) | (frame["inf_count"] > 0)).sum()) if len(frame) else 0
    compared = sum(counts[v] for v in COMPARED_VERDICTS)
    columns = [
        c
        for c in ("case", "candidate", "comparison", "leaf", "verdict", "reason", "bound_usage", *CAUSE_COLUMNS)
        if c in frame
    ]
    records = frame[columns].to_dict(orient="records") if len(frame) else []
    missing = uncompared(records, implementations)
    return {
        "total": int(len(frame)),
        "verdicts": counts,
        "compared": compared,
        "uncompared": missing,
        "ok": all(counts[v] == 0 for v in FAILING_VERDICTS) and not missing,
        "cases": int(frame["case"].nunique()) if len(frame) else 0,
        "by_comparison": by_comparison,
        "rows_with_nan_or_inf": nonfinite,
        "worst_leaf": worst_leaf(frame),
        "sharpness": sharpness(frame).to_dict(orient="records") if len(frame) else [],
        "implementations": [v.as_dict() for v in implementation_verdicts(records)],
        "causes": [g.as_dict() for g in cause_groups(records)],
    }


# The comparisons a policy rule bounds (lowering rows carry no bound_usage).
BOUNDED_COMPARISONS = ("vs_oracle", "vs_reference", "vs_unsharded")
USAGE_GROUP_COLUMNS = (
    "passing",
    "failing",
    "median_usage",
    "p90_usage",
    "max_usage",
    "closest_case",
    "closest_candidate",
    "closest_leaf",
    "closest_bound",
)


def usage_groups(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of `keys`, over the bounded comparisons: passing and failing counts, median, p90 and largest
    bound_usage of the passing rows (NaN without any), and the passing row closest to its bound."""
    bounded = frame[frame["comparison"].isin(BOUNDED_COMPARISONS) & frame["verdict"].isin(["pass", *FAILING_VERDICTS])]
    lines = []
    for values, group in bounded.groupby(keys, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        passing = group[(group["verdict"] == "pass") & group["bound_usage"].notna()]
        usage = passing["bound_usage"].astype(float)
        closest = passing.loc[usage.idxmax()] if len(passing) else None
        lines.append(
            {
                **dict(zip(keys, values)),
                "passing": int((group["verdict"] == "pass").sum()),
                "failing": int(group["verdict"].isin(FAILING_VERDICTS).sum()),
                "median_usage": float(usage.median()) if len(usage) else math.nan,
                "p90_usage": float(usage.quantile(0.9)) if len(usage) else math.nan,
                "max_usage": float(usage.max()) if len(usage) else math.nan,
                "closest_case": "" if closest is None else str(closest["case"]),
                "closest_candidate": "" if closest is None else str(closest["candidate"]),
                "closest_leaf": "" if closest is None else str(closest["leaf"]),
                "closest_bound": "" if closest is None else str(closest["bound"]),
            }
        )
    return pd.DataFrame(lines, columns=[*keys, *USAGE_GROUP_COLUMNS])


def sharpness(frame: pd.DataFrame) -> pd.DataFrame:
    return usage_groups(frame, ["comparison", "act_dtype"])


@dataclasses.dataclass(frozen=True)
class CaseMemory:
    """One case's oracle: its measured peak and its budget, in bytes."""

    case: str
    peak_bytes: float
    budget_bytes: float

    @property
    def share(self) -> float:
        """Peak ÷ budget (over 1: the estimate was exceeded)."""
        return self.peak_bytes / self.budget_bytes

    @property
    def within(self) -> bool:
        return self.peak_bytes <= self.budget_bytes


def case_memories(rows: Iterable[dict]) -> list[CaseMemory]:
    """The measured cases' oracles, in row order; cases without the figures are left out."""
    found: dict[str, CaseMemory] = {}
    for row in rows:
        peak, budget = row.get("oracle_peak_bytes"), row.get("oracle_budget_bytes")
        if row["case"] in found or not _finite(peak) or not _finite(budget):
            continue
        found[row["case"]] = CaseMemory(row["case"], float(peak), float(budget))
    return list(found.values())


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def gigabytes(value: float) -> str:
    return f"{value / 1e9:.2f} GB"


def memory_line(memories: list[CaseMemory]) -> str:
    """One sentence on the measured oracle peaks ("" where none was measured)."""
    if not memories:
        return ""
    over = [m for m in memories if not m.within]
    largest = max(memories, key=lambda m: m.share)
    verdict = (
        "each within its case-memory estimate"
        if not over
        else f"{len(over)} over its estimate: " + ", ".join(f"{m.case} {m.share:.2f}" for m in over)
    )
    return (
        f"host memory: the oracle of {len(memories)} case(s) ran in a process of its own, peaks "
        f"{gigabytes(min(m.peak_bytes for m in memories))} to {gigabytes(max(m.peak_bytes for m in memories))}, "
        f"{verdict} (largest share {largest.share:.2f} of its budget, {largest.case})"
    )


def memory_table(memories: list[CaseMemory]) -> Table:
    """The Host memory section's table: a row per measured case."""
    columns = (
        Column("case"),
        *(Column(h, numeric=True) for h in ("oracle peak", "budget", "share")),
        Column("within"),
    )
    rows = (
        (m.case, gigabytes(m.peak_bytes), gigabytes(m.budget_bytes), f"{m.share:.2f}", "yes" if m.within else "NO")
        for m in memories
    )
    return Table(columns, tuple(rows))
