"""Rows on disk while a run is in progress: a JSONL stream and a list of finished cases.

`rows.jsonl` gets one JSON object per row, flushed as each case's rows arrive, so a
killed run keeps everything it finished. `cases-done.txt` lists the cases whose rows are
all written. `--resume` keeps the rows of finished cases, drops a half-written case
(and a torn last line), and the runner redoes only what is missing. Whether the stream
belongs to the run being resumed is the manifest's business (`harness.manifest`).
"""

from __future__ import annotations

import json
import math
import os
import pathlib

from harness.manifest import REPORT_FILES
from harness.schema import ROW_COLUMNS

ROWS_FILE = "rows.jsonl"
DONE_FILE = "cases-done.txt"


class StoreError(ValueError):
    """The output folder holds something that is not a resumable run."""


def _encode(value):
    # JSON has no NaN/Infinity: encode them as strings that load_rows understands.
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _decode(value):
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value


class RowStore:
    """Append-only row stream in `folder`: `start_fresh()`, or `finished()` then `keep()` to
    continue a run, before appending."""

    def __init__(self, folder: pathlib.Path):
        self.folder = pathlib.Path(folder)
        self.rows_path = self.folder / ROWS_FILE
        self.done_path = self.folder / DONE_FILE

    def start_fresh(self) -> None:
        """Begin a new run here: remove an earlier run's stream and reports."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in (self.rows_path, self.done_path):
            path.unlink(missing_ok=True)
        self.remove_reports()

    def remove_reports(self) -> None:
        """Delete the reports of a run: they are rewritten when the run completes."""
        for name in REPORT_FILES.values():
            (self.folder / name).unlink(missing_ok=True)

    def has_rows(self) -> bool:
        """True if a row stream exists here (an earlier run's, finished or not)."""
        return self.rows_path.exists()

    def finished(self) -> tuple[list[dict], set[str]]:
        """Rows and names of the cases finished here, read without changing anything.

        Rows of a half-written case and a torn last line (a kill mid-write) are left
        out; StoreError if the stream holds anything else that is not a row.
        """
        if not self.rows_path.exists():
            return [], set()
        done = set(self.done_path.read_text().split()) if self.done_path.exists() else set()
        rows = []
        lines = self.rows_path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            try:
                row = {k: _decode(v) for k, v in json.loads(line).items()}
            except json.JSONDecodeError as exc:
                if number == len(lines):  # torn by a kill mid-write
                    break
                raise StoreError(f"{self.rows_path}:{number}: not a JSON row ({exc.msg})") from exc
            except AttributeError:
                raise StoreError(f"{self.rows_path}:{number}: not a JSON object") from None
            if set(row) != set(ROW_COLUMNS):
                raise StoreError(f"{self.rows_path}:{number}: columns do not match the row schema")
            if row["case"] in done:
                rows.append(row)
        return rows, done

    def keep(self, rows: list[dict]) -> None:
        """Continue the run here with just `rows` in the stream (see `finished`); reports go."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.rows_path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps({k: _encode(v) for k, v in r.items()}) + "\n" for r in rows))
        os.replace(tmp, self.rows_path)
        self.remove_reports()

    def append_case(self, case_name: str, rows: list[dict]) -> None:
        """Write one case's rows, then mark the case finished."""
        with self.rows_path.open("a") as f:
            for row in rows:
                f.write(json.dumps({k: _encode(v) for k, v in row.items()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        with self.done_path.open("a") as f:
            f.write(case_name + "\n")
