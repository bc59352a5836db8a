"""Rows on disk while a run is in progress: a JSONL stream and a list of finished cases.

`rows.jsonl` gets one JSON object per row, flushed as each case's rows arrive, so a
killed run keeps everything it finished. `cases-done.txt` lists the cases whose rows are
all written. `--resume` keeps the rows of finished cases, drops a half-written case
(and a torn last line), and the runner redoes only what is missing. Whether the stream
belongs to the run being resumed is the manifest's business (`reports.manifest`).
"""

from __future__ import annotations

import json
import os
import pathlib

from reports.manifest import REPORT_FILES
from reports.rows import encode_float, parse_float
from reports.schema import FLOAT_COLUMNS, ROW_COLUMNS

ROWS_FILE = "rows.jsonl"
DONE_FILE = "cases-done.txt"


class StoreError(ValueError):
    """The output folder holds something that is not a resumable run."""


def _encode(row: dict) -> str:
    """One JSONL line; non-finite floats as `reports.rows.encode_float` writes them."""
    return json.dumps({k: encode_float(v) if isinstance(v, float) else v for k, v in row.items()}) + "\n"


def _decode(row: dict) -> dict:
    """A row read back: float columns as floats (NaN and infinities included)."""
    return {k: parse_float(v) if k in FLOAT_COLUMNS else v for k, v in row.items()}


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
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                if number == len(lines):  # torn by a kill mid-write
                    break
                raise StoreError(f"{self.rows_path}:{number}: not a JSON row ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise StoreError(f"{self.rows_path}:{number}: not a JSON object")
            if set(row) != set(ROW_COLUMNS):
                raise StoreError(f"{self.rows_path}:{number}: columns do not match the row schema")
            try:
                row = _decode(row)
            except ValueError as exc:
                raise StoreError(f"{self.rows_path}:{number}: {exc}") from None
            if row["case"] in done:
                rows.append(row)
        return rows, done

    def keep(self, rows: list[dict]) -> None:
        """Continue the run here with just `rows` in the stream (see `finished`); reports go."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.rows_path.with_suffix(".tmp")
        tmp.write_text("".join(_encode(r) for r in rows))
        os.replace(tmp, self.rows_path)
        self.remove_reports()

    def append_case(self, case_name: str, rows: list[dict]) -> None:
        """Write one case's rows, then mark the case finished."""
        with self.rows_path.open("a") as f:
            for row in rows:
                f.write(_encode(row))
            f.flush()
            os.fsync(f.fileno())
        with self.done_path.open("a") as f:
            f.write(case_name + "\n")
