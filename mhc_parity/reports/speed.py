"""The paths' speed against the reference, from a run's rows (`execute_s`, forward and VJP together): each `SpeedLine`
sets a path's time beside its `vs_reference` partner's from the same run. Only accelerator times are speed measurements:
on a CPU a Pallas kernel runs in interpret mode and the time includes a first call's cost, so those lines are labelled
as not measured.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pandas as pd

from mhc_parity.records.text import format_number
from mhc_parity.reports.tables import Cell, Column, Table

# A `devices` cell's host-CPU platform; the same as `harness.engine.devices.HOST_PLATFORM` (not imported here).
HOST_PLATFORM = "cpu"


def device_platform(devices: str) -> str:
    """The platform of a row's `devices` cell ("tpu:0" -> "tpu"; "" where it has none)."""
    return devices.split(":", 1)[0]


NOT_MEASURED_ON_CPU = "CPU: not a speed measurement"
# The class the HTML page greys a cell with that measures no speed.
UNMEASURED = "unmeasured"
SPEED_NOTE = (
    "Each path's program (forward and VJP together) beside the reference path's on the same "
    "sharding and devices, from the same run; speed-up = reference time / path time (above 1: "
    "faster than the reference). On an accelerator a time is the device time per run, of runs "
    "issued back to back after warm-up with nothing else in the process running; on the CPU the "
    "program ran once. A time on the CPU is not a speed measurement: "
    "there a Pallas kernel runs in interpret mode, which emulates the kernel with ordinary XLA "
    "operations. The interpret path does so on any device; the Mosaic path is the compiled kernel."
)


@dataclasses.dataclass(frozen=True)
class SpeedLine:
    """One path of one case beside its reference path, seconds of each. runs: how many runs the path's time is of (NaN:
    not recorded); devices, reference_devices: their `devices` cells."""

    case: str
    candidate: str
    reference: str
    devices: str
    reference_devices: str
    candidate_s: float
    reference_s: float
    runs: float

    @property
    def platform(self) -> str:
        return device_platform(self.devices)

    @property
    def comparable(self) -> bool:
        """Both ran on the same devices (a ratio across devices says nothing about the code)."""
        return self.devices == self.reference_devices

    @property
    def speedup(self) -> float:
        """reference_s / candidate_s (above 1: the path is faster); NaN where not comparable."""
        if not self.comparable or not self.candidate_s > 0:
            return math.nan
        return self.reference_s / self.candidate_s

    @property
    def measured(self) -> bool:
        return self.comparable and self.platform != HOST_PLATFORM

    @property
    def label(self) -> str:
        if not self.comparable:
            return f"not comparable: the reference ran on {self.reference_devices}"
        if self.platform == HOST_PLATFORM:
            return NOT_MEASURED_ON_CPU
        if math.isnan(self.runs):
            return f"{self.platform}: timing runs not recorded"
        runs = int(self.runs)
        return f"{self.platform}: {runs} timed runs" if runs > 1 else f"{self.platform}: one run"


def _path_times(frame: pd.DataFrame) -> dict[tuple[str, str], tuple[float, float, str]]:
    """(case, path) -> (execute_s, execute_runs, devices) of each timed path (every row of a path in a case carries the
    same timing)."""
    timed = frame[frame["execute_s"].map(math.isfinite)]
    timed = timed.drop_duplicates(["case", "candidate"])
    return {
        (r["case"], r["candidate"]): (r["execute_s"], r["execute_runs"], r["devices"])
        for r in timed[["case", "candidate", "execute_s", "execute_runs", "devices"]].to_dict(orient="records")
    }


def speed_lines(frame: pd.DataFrame) -> list[SpeedLine]:
    """A line per (case, path, reference) of a `vs_reference` comparison where both were timed, in frame order (a
    canonical row frame)."""
    if not len(frame):
        return []
    times = _path_times(frame)
    pairs = frame.loc[frame["comparison"] == "vs_reference", ["case", "candidate", "partner"]].drop_duplicates()
    lines = []
    for case, candidate, reference in pairs.itertuples(index=False):
        mine, theirs = times.get((case, candidate)), times.get((case, reference))
        if mine is None or theirs is None:
            continue
        lines.append(SpeedLine(case, candidate, reference, mine[2], theirs[2], mine[0], theirs[0], mine[1]))
    return lines


@dataclasses.dataclass(frozen=True)
class SpeedSummary:
    """One path name's median speed-up over its cases."""

    candidate: str
    reference: str
    platform: str
    cases: int
    median_speedup: float
    measured: bool

    @property
    def text(self) -> str:
        """e.g. "mosaic/unsharded vs reference/unsharded on tpu: median speed-up 3.1 over 12 cases"."""
        head = f"{self.candidate} vs {self.reference} on {self.platform}: median speed-up"
        tail = f"{format_number(self.median_speedup, nan='—')} over {self.cases} case{'s' if self.cases != 1 else ''}"
        return f"{head} {tail}" + ("" if self.measured else f" ({NOT_MEASURED_ON_CPU})")


def speed_summaries(lines: list[SpeedLine]) -> list[SpeedSummary]:
    """Per (path, reference, platform), in first-seen order: the median of its comparable lines' speed-ups."""
    groups: dict[tuple[str, str, str], list[SpeedLine]] = {}
    for line in lines:
        groups.setdefault((line.candidate, line.reference, line.platform), []).append(line)
    summaries = []
    for (candidate, reference, platform), members in groups.items():
        ratios = [line.speedup for line in members if math.isfinite(line.speedup)]
        summaries.append(
            SpeedSummary(
                candidate,
                reference,
                platform,
                len(ratios),
                statistics.median(ratios) if ratios else math.nan,
                all(line.measured for line in members),
            )
        )
    return summaries


def speedup_table(lines: list[SpeedLine]) -> Table:
    """The Speed section's second table: a row per `SpeedLine`, what measures nothing greyed on the page."""
    columns = (
        *map(Column, ("case", "path", "reference", "devices")),
        Column("path s", numeric=True),
        Column("reference s", numeric=True),
        Column("speed-up", numeric=True, nan="—"),
        Column("what it is"),
    )
    rows = (
        (
            line.case,
            line.candidate,
            line.reference,
            line.devices,
            line.candidate_s,
            line.reference_s,
            line.speedup,
            line.label if line.measured else Cell(line.label, UNMEASURED),
        )
        for line in lines
    )
    return Table(columns, tuple(rows))
