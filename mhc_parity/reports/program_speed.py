"""Each program's device time against what its chip can do: the Speed section's table, its plot and speed.csv.

One `ProgramSpeed` per (case, path) that ran, from its rows' `execute_s` and `bytes_moved` (`records.roofline`). The
chip is the run's `device_kind` for a path on the run's backend; a host path (`@cpu`) ran on the CPU, which has no
stated peak.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import pandas as pd

from mhc_parity.records.roofline import Throughput, throughput
from mhc_parity.records.rows import encode_float
from mhc_parity.reports.speed import HOST_PLATFORM, UNMEASURED, device_platform
from mhc_parity.reports.tables import Cell, Column, Table

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
