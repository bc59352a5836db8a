"""Each case's float64 oracle run in a process of its own: its measured peak host memory (`oracle_peak_bytes`) against
the case-memory estimate's budget (`oracle_budget_bytes`). Cases without the figures are not listed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable


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


def memory_table_rows(memories: list[CaseMemory]) -> list[tuple]:
    return [
        (m.case, gigabytes(m.peak_bytes), gigabytes(m.budget_bytes), f"{m.share:.2f}", "yes" if m.within else "NO")
        for m in memories
    ]
