"""A run's failing rows grouped by cause (one bug breaks many rows), and one verdict per implementation. Error rows
group by message, failing rows without a cause by reason.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from mhc_parity.records.cause_consistency import consistent_causes, located
from mhc_parity.records.path_names import implementation_of
from mhc_parity.records.schema import COMPARED_VERDICTS
from mhc_parity.records.text import format_number, plural

# The row columns the groups read besides a row's identity, verdict, reason and usage.
CAUSE_COLUMNS = ("cause", "cause_id", "cause_explained")
# Verdicts a group collects, worst first.
GROUPED_VERDICTS = ("error", "fail")


def uncompared(rows: Iterable[Mapping[str, Any]], implementations: Sequence[str] = ()) -> list[str]:
    """What a run compared nothing of (no pass or fail row): ["the run"] if nothing at all, else each of
    `implementations` that is the candidate of no compared row; [] if everything under test compared something."""
    compared = {implementation_of(str(r["candidate"])) for r in rows if r["verdict"] in COMPARED_VERDICTS}
    if not compared:
        return ["the run"]
    return [name for name in implementations if name not in compared]


def compress_paths(paths: Iterable[str]) -> list[str]:
    """Path names, those of one implementation written `impl/*` where there are several."""
    by_impl: dict[str, list[str]] = {}
    for path in dict.fromkeys(paths):
        by_impl.setdefault(implementation_of(path), []).append(path)
    return [members[0] if len(members) == 1 else f"{impl}/*" for impl, members in by_impl.items()]


def _code(name: str) -> str:
    return f"`{name}`"


def _listed(names: Sequence[str], quote: Callable[[str], str], limit: int = 4) -> str:
    shown = ", ".join(quote(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


@dataclasses.dataclass(frozen=True)
class CauseGroup:
    """Failing (or error) rows sharing one cause. cause: in words (for rows without a cause, their reason); cause_id:
    the hypotheses' names, "unexplained", or "" for a reason."""

    verdict: str
    cause: str
    cause_id: str
    rows: tuple[Mapping[str, Any], ...]

    @property
    def leaves(self) -> list[str]:
        return list(dict.fromkeys(str(r["leaf"]) for r in self.rows))

    @property
    def candidates(self) -> list[str]:
        return compress_paths(str(r["candidate"]) for r in self.rows)

    @property
    def implementations(self) -> list[str]:
        return list(dict.fromkeys(implementation_of(str(r["candidate"])) for r in self.rows))

    @property
    def cases(self) -> int:
        return len({r["case"] for r in self.rows})

    @property
    def explained(self) -> float:
        """Median fraction of the rows' error their cause explains (NaN without one)."""
        values = [v for v in (_float(r.get("cause_explained")) for r in self.rows) if math.isfinite(v)]
        return statistics.median(values) if values else math.nan

    @property
    def worst_usage(self) -> float:
        values = [v for v in (_float(r.get("bound_usage")) for r in self.rows) if math.isfinite(v)]
        return max(values) if values else math.nan

    def heading(self, quote: Callable[[str], str] = _code, text: Callable[[str], str] = str) -> str:
        """e.g. "26 rows in 13 cases: `d_post_bias` of `interpret/*` — <cause> (explains 97%)"."""
        return format_heading(self.summary(), quote, text)

    def summary(self) -> dict:
        return {
            "verdict": self.verdict,
            "cause": self.cause,
            "cause_id": self.cause_id,
            "rows": len(self.rows),
            "cases": self.cases,
            "leaves": self.leaves,
            "candidates": self.candidates,
            "explained": self.explained,
            "worst_usage": self.worst_usage,
        }

    def as_dict(self) -> dict:
        """The group as JSON-able data (report.json): its `summary` and its rows."""
        members = [
            {
                "case": r["case"],
                "candidate": r["candidate"],
                "partner": r.get("partner", ""),
                "leaf": r["leaf"],
                "usage": format_number(_float(r.get("bound_usage")), nan="-"),
            }
            for r in self.rows
        ]
        return {**self.summary(), "members": members}


def format_heading(
    group: Mapping[str, Any], quote: Callable[[str], str] = _code, text: Callable[[str], str] = str
) -> str:
    """A cause group's one-line heading from `CauseGroup.summary` data. quote: how a leaf or path name is written; text:
    how the cause is written (e.g. escaped for Markdown)."""
    where = f"{_listed(group['leaves'], quote)} of {_listed(group['candidates'], quote)}"
    what = text(group["cause"]) if group["verdict"] == "fail" else f"error: {text(group['cause'])}"
    explained = _float(group["explained"])
    if group["cause_id"] and math.isfinite(explained):
        share = f"{max(explained, 0.0):.0%}"
        what += (
            f" (the best rounding explains {share})" if group["cause_id"] == "unexplained" else f" (explains {share})"
        )
    return f"{plural(group['rows'], 'row')} in {plural(group['cases'], 'case')}: {where} — {what}"


def stated_causes(frame: pd.DataFrame) -> pd.DataFrame:
    """A canonical row frame with its failing rows' causes as a finished run's files state them (`consistent_causes`);
    `frame` itself where nothing changes, else a copy."""
    if not len(frame) or "cause_id" not in frame:
        return frame
    failing = frame.index[frame["verdict"] == "fail"]
    columns = ["case", "candidate", "leaf", "verdict", "cause", "cause_id"]
    recorded = frame.loc[failing, columns].to_dict(orient="records")
    changed = [
        (index, stated)
        for index, before, stated in zip(failing, recorded, consistent_causes(recorded))
        if (stated["cause"], stated["cause_id"]) != (before["cause"], before["cause_id"])
    ]
    if not changed:
        return frame
    frame = frame.copy()
    for index, stated in changed:
        frame.at[index, "cause"] = stated["cause"]
        frame.at[index, "cause_id"] = stated["cause_id"]
    return frame


def cause_groups(rows: Iterable[Mapping[str, Any]]) -> list[CauseGroup]:
    """The failing and error rows grouped by implementation and cause (as `consistent_causes` states them), largest
    group first."""
    grouped: dict[tuple[str, str, str, str], list[Mapping[str, Any]]] = {}
    for row in consistent_causes(rows):
        verdict = str(row["verdict"])
        if verdict not in GROUPED_VERDICTS:
            continue
        cause_id = str(row.get("cause_id") or "")
        if cause_id:
            cause = str(row.get("cause") or "")
        else:  # a row without leaves to attribute: its reason's first line names it
            reason = str(row.get("reason") or "").strip().splitlines()
            cause = reason[0][:200] if reason else "(no reason given)"
        # The same words in two implementations are two bugs; one cause_id is one cause whatever its
        # words add.
        key = (implementation_of(str(row["candidate"])), verdict, cause_id, "" if cause_id else cause)
        grouped.setdefault(key, []).append(row)
    groups = []
    for (_, verdict, cause_id, reason), members in grouped.items():
        # A cause's group says the words most of its rows say; a reason's group, the reason.
        cause = reason or collections.Counter(str(r.get("cause") or "") for r in members).most_common(1)[0][0]
        groups.append(CauseGroup(verdict, cause, cause_id, tuple(members)))
    order = {v: i for i, v in enumerate(GROUPED_VERDICTS)}
    return sorted(groups, key=lambda g: (-len(g.rows), order[g.verdict], g.cause))


@dataclasses.dataclass(frozen=True)
class ImplementationVerdict:
    """An implementation's verdict ("pass", "fail", "error", or "skip": nothing compared) with its failing and error
    rows' cause groups; where: where a failing one goes wrong first (`located`)."""

    name: str
    verdict: str
    rows: int
    groups: tuple[CauseGroup, ...]
    where: str = ""

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "rows": self.rows,
            "where": self.where,
            "causes": [g.as_dict() for g in self.groups],
        }


def implementation_verdicts(rows: Iterable[Mapping[str, Any]]) -> list[ImplementationVerdict]:
    by_impl: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_impl.setdefault(implementation_of(str(row["candidate"])), []).append(row)
    verdicts = []
    for name, members in by_impl.items():
        seen = {str(r["verdict"]) for r in members}
        verdict = next((v for v in ("error", "fail") if v in seen), "pass" if "pass" in seen else "skip")
        where = located(members).get(name, "")
        verdicts.append(ImplementationVerdict(name, verdict, len(members), tuple(cause_groups(members)), where))
    return verdicts
