"""A run's Speed section, from its rows (`execute_s`, forward and VJP together), as tables every printer shows and
speed.csv:

- each program's device time against what its chip can do: one `ProgramSpeed` per (case, path) that ran, from its rows'
  `execute_s` and `bytes_moved` (`records.roofline`), with the plot's numbers (`RooflineFigure`). The chip is the run's
  `device_kind` for a path on the run's backend; a host path (`@cpu`) ran on the CPU, which has no stated peak;
- the paths' speed against the reference: each `SpeedLine` sets a path's time beside its `vs_reference` partner's from
  the same run.

Only accelerator times are speed measurements: on a CPU a Pallas kernel runs in interpret mode and the time includes a
first call's cost, so those lines are labelled as not measured.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from pathlib import Path

import pandas as pd

from mhc_parity.records.roofline import Throughput, throughput
from mhc_parity.records.rows import encode_float
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


SPEED_COLUMNS = (
    "case",
    "path",
    "devices",
    "device_kind",
    "timing",
    "runs",
    "device_s",
    "first_s",
    "bytes_moved",
    "gb_per_s",
    "peak_gb_per_s",
    "fraction_of_peak",
)
NO_PEAK = "no stated peak"
PROGRAM_SPEED_NOTE = (
    "Each program (forward and VJP together) per case: its device time per run, the bytes it must "
    "move at least (its arguments and results), the bandwidth that gives, and its fraction of the "
    "chip's peak HBM bandwidth (the mHC layer is memory-bound; bench/speed_run.py adds each case's "
    "FLOPs, which an MLP branch makes matter as much). On an accelerator the time is "
    "of runs issued back to back after warm-up, with nothing else in the process running; on the "
    "host CPU it is the program's one call, run beside the run's background work (the next cases' "
    "oracle answers and compiles): not a speed measurement, and a CPU has no stated peak."
)


@dataclasses.dataclass(frozen=True)
class ProgramSpeed:
    """One path's program on one case. device_kind: JAX's `device_kind`, or the platform where it is not the run's
    backend ("cpu"); "" if unrecorded. runs: `execute_runs` (NaN: unrecorded). bytes_moved: NaN in runs older than the
    column."""

    case: str
    path: str
    devices: str
    device_kind: str
    runs: float
    device_s: float
    first_s: float
    bytes_moved: float

    @property
    def platform(self) -> str:
        return device_platform(self.devices)

    @property
    def rates(self) -> Throughput:
        return throughput(self.bytes_moved, self.device_s, self.device_kind)

    @property
    def peak_gb_per_s(self) -> float:
        peaks = self.rates.peaks
        return math.nan if peaks is None else peaks.hbm_bytes_per_s / 1e9

    @property
    def alone(self) -> bool:
        """Timed on an accelerator, back to back with the process quiet (runs since `bytes_moved`, which came with that
        timing)."""
        return (
            not math.isnan(self.bytes_moved) and self.platform != HOST_PLATFORM and self.runs > 1  # NaN > 1 is False
        )

    @property
    def timing(self) -> str:
        if self.alone:
            return f"{self.platform}: {int(self.runs)} runs back to back, alone"
        if math.isnan(self.bytes_moved):  # written before the device timing (issue 55)
            return "written before the device timing: not alone in the process"
        if self.platform == HOST_PLATFORM:
            return "CPU: one call, not alone; not a speed measurement"
        return f"{self.platform}: one call, not alone"


def _device_kind(devices: str, metadata: dict) -> str:
    platform = device_platform(devices)
    if platform and platform == metadata.get("backend"):
        return str(metadata.get("device_kind") or "")
    return platform


def program_speeds(frame: pd.DataFrame, metadata: dict | None = None) -> list[ProgramSpeed]:
    """A `ProgramSpeed` per (case, path) of a canonical row frame whose path was timed (finite `execute_s`), in frame
    order; metadata: the run's (backend, device kind)."""
    if not len(frame):
        return []
    metadata = metadata or {}
    timed = frame[frame["execute_s"].map(math.isfinite)].drop_duplicates(["case", "candidate"])
    columns = ["case", "candidate", "devices", "execute_runs", "execute_s", "execute_first_s", "bytes_moved"]
    return [
        ProgramSpeed(
            case=str(r["case"]),
            path=str(r["candidate"]),
            devices=str(r["devices"]),
            device_kind=_device_kind(str(r["devices"]), metadata),
            runs=float(r["execute_runs"]),
            device_s=float(r["execute_s"]),
            first_s=float(r["execute_first_s"]),
            bytes_moved=float(r["bytes_moved"]),
        )
        for r in timed[columns].to_dict(orient="records")
    ]


def program_speed_table(speeds: list[ProgramSpeed]) -> Table:
    """The Speed section's first table: a row per program, what measures nothing greyed on the page."""
    columns = (
        *map(Column, ("case", "program", "devices")),
        Column("device ms", numeric=True),
        Column("MB moved", numeric=True),
        Column("GB/s", numeric=True, nan="—"),
        Column("of peak HBM", numeric=True),
        Column("timing"),
    )
    rows = (
        (
            s.case,
            s.path,
            s.devices,
            s.device_s * 1e3,
            s.bytes_moved / 1e6,
            s.rates.gb_per_s,
            s.rates.hbm_fraction if s.rates.peaks is not None else Cell(NO_PEAK, UNMEASURED),
            s.timing if s.alone else Cell(s.timing, UNMEASURED),
        )
        for s in speeds
    )
    return Table(columns, tuple(rows))


def has_peak(speeds: list[ProgramSpeed]) -> bool:
    return any(s.rates.peaks is not None for s in speeds)


def speed_csv_rows(speeds: list[ProgramSpeed]) -> list[tuple]:
    return [
        (
            s.case,
            s.path,
            s.devices,
            s.device_kind,
            s.timing,
            *(
                encode_float(v)
                for v in (
                    s.runs,
                    s.device_s,
                    s.first_s,
                    s.bytes_moved,
                    s.rates.gb_per_s,
                    s.peak_gb_per_s,
                    s.rates.hbm_fraction,
                )
            ),
        )
        for s in speeds
    ]


def write_speed_csv(speeds: list[ProgramSpeed], path: Path) -> Path:
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(SPEED_COLUMNS)
        writer.writerows(speed_csv_rows(speeds))
    return Path(path)


@dataclasses.dataclass(frozen=True)
class RooflineFigure:
    """The plot's numbers: (case, path, fraction of the chip's peak HBM bandwidth) per program, cases in order;
    `device_kind` and `peak_gb_per_s` its chip's."""

    device_kind: str
    peak_gb_per_s: float
    points: tuple[tuple[str, str, float], ...]


def roofline_figure(speeds: list[ProgramSpeed]) -> RooflineFigure | None:
    """The figure of the programs on a chip with a stated peak (None if none); a run has one accelerator kind, and host
    paths are left out of the plot, not the table."""
    on_chip = [s for s in speeds if s.rates.peaks is not None and math.isfinite(s.rates.hbm_fraction)]
    if not on_chip:
        return None
    kind = on_chip[0].device_kind
    return RooflineFigure(
        kind,
        on_chip[0].peak_gb_per_s,
        tuple((s.case, s.path, s.rates.hbm_fraction) for s in on_chip if s.device_kind == kind),
    )
