"""Rows on disk while a run is in progress: `rows.jsonl`, flushed case by case, and `cases-done.txt`. `--resume` keeps
the finished cases' rows and drops a half-written case and a torn last line; the manifest's per-case digests
(`Manifest.rows_problem`) reject cut, duplicated, edited or stale lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence

from mhc_parity.records.cause_consistency import as_recorded
from mhc_parity.records.files import atomic_write
from mhc_parity.records.manifest import REPORT_FILES, CaseRecord
from mhc_parity.records.rows import ReportInputError, coerce_row, encode_float, parse_float
from mhc_parity.records.schema import COLUMN_TYPES, FLOAT_COLUMNS, ROW_COLUMNS

ROWS_FILE = "rows.jsonl"
DONE_FILE = "cases-done.txt"


class StoreError(ValueError):
    """The output folder holds something that is not a resumable run."""


def _encode(row: dict) -> str:
    return json.dumps({k: encode_float(v) if isinstance(v, float) else v for k, v in row.items()}) + "\n"


def _decode(row: dict) -> dict:
    return {k: parse_float(v) if k in FLOAT_COLUMNS else v for k, v in row.items()}


def _canonical(row: Mapping) -> str:
    """A row as one storage-independent line: cells coerced to their schema types, schema order."""
    return _typed_line(coerce_row(row, f"row of case {row.get('case')!r}"))


_LINE_CELLS = tuple(COLUMN_TYPES.items())
# json.dumps makes an encoder per call; one serves every line.
_LINE_ENCODER = json.JSONEncoder(allow_nan=False)


def _typed_line(typed: Mapping) -> str:
    cells = [
        encode_float(float(typed[c])) if kind is float else int(typed[c]) if kind is int else typed[c]
        for c, kind in _LINE_CELLS
    ]
    return _LINE_ENCODER.encode(cells)


def case_records(rows: Iterable[Mapping], cases: Sequence[str] = ()) -> dict[str, CaseRecord]:
    """Per case: row count and sha256 over its rows' canonical lines, sorted (independent of row order); `cases` without
    rows get 0. Rows are digested `as_recorded` (the cause its case named). ReportInputError for a row that does not fit
    the schema."""
    return _records(((str(row["case"]), _canonical(as_recorded(row))) for row in rows), cases)


def typed_case_records(typed_rows: Iterable[Mapping], cases: Sequence[str] = ()) -> dict[str, CaseRecord]:
    """`case_records` of rows already typed with every column present (`coerce_row`'s, or a canonical frame's records),
    not coerced again."""
    return _records(((str(row["case"]), _typed_line(as_recorded(row))) for row in typed_rows), cases)


def _records(lines_of_rows: Iterable[tuple[str, str]], cases: Sequence[str]) -> dict[str, CaseRecord]:
    lines: dict[str, list[str]] = {case: [] for case in cases}
    for case, line in lines_of_rows:
        lines.setdefault(case, []).append(line)
    records = {}
    for case, case_lines in lines.items():
        digest = hashlib.sha256("\n".join(sorted(case_lines)).encode()).hexdigest()
        records[case] = CaseRecord(case, len(case_lines), digest)
    return records


class RowStore:
    """Append-only row stream in `folder`: `start_fresh()`, or `finished()` then `keep()` to continue a run, before
    appending."""

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
        """Delete a run's reports: they are rewritten when it completes."""
        for name in REPORT_FILES.values():
            (self.folder / name).unlink(missing_ok=True)

    def has_rows(self) -> bool:
        return self.rows_path.exists()

    def finished(self) -> tuple[list[dict], dict[str, CaseRecord]]:
        """Rows of the cases finished here and their records, read without changing anything. A half-written case and a
        torn last line are left out; StoreError for anything else that is not a row."""
        if not self.rows_path.exists():
            return [], {}
        done = self.done_path.read_text().split() if self.done_path.exists() else []
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
        try:
            return rows, case_records(rows, done)
        except ReportInputError as exc:
            raise StoreError(f"{self.rows_path}: {exc}") from None

    def keep(self, rows: list[dict], cases: Sequence[str]) -> None:
        """Continue the run with just `rows` of the finished `cases` in the stream; reports go."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for path, text in (
            (self.rows_path, "".join(_encode(r) for r in rows)),
            (self.done_path, "".join(case + "\n" for case in cases)),
        ):
            atomic_write(path, text.encode())
        self.remove_reports()

    def append_case(self, case_name: str, rows: list[dict], *, record: CaseRecord | None = None) -> CaseRecord:
        """Write one case's rows, then mark it finished; returns its record (`record` if the caller has it:
        `typed_case_records` of these rows)."""
        if record is None:
            records = case_records(rows, [case_name])
            if len(records) != 1:
                others = sorted(set(records) - {case_name})
                raise ValueError(f"append_case({case_name!r}): rows of other cases {others}")
            record = records[case_name]
        elif record.case != case_name or record.rows != len(rows):
            raise ValueError(f"append_case({case_name!r}): the record given is of other rows ({record})")
        with _whole_or_nothing(self.rows_path):
            with self.rows_path.open("a") as f:
                for row in rows:
                    f.write(_encode(row))
                f.flush()
                os.fsync(f.fileno())
        with _whole_or_nothing(self.done_path):
            with self.done_path.open("a") as f:
                f.write(case_name + "\n")
        return record


@contextlib.contextmanager
def _whole_or_nothing(path: pathlib.Path):
    """Appending to `path`: a failed append (a full disk) cuts the file back, leaving no torn line for a resume to
    refuse."""
    size = path.stat().st_size if path.exists() else 0
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.truncate(path, size)
        raise
