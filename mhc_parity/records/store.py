"""Rows on disk while a run is in progress: a JSONL stream and a list of finished cases.

`rows.jsonl` gets one JSON object per row, flushed as each case's rows arrive, so a
killed run keeps everything it finished. `cases-done.txt` lists the cases whose rows are
all written. `--resume` keeps the rows of finished cases, drops a half-written case
(and a torn last line), and the runner redoes only what is missing.

Whether the stream belongs to the run is checked against the manifest, which records
each finished case's row count and digest (`case_records`, `Manifest.rows_problem`): a
cut, duplicated or edited line, or rows an earlier run left behind, do not match.
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
    """One JSONL line; non-finite floats as `mhc_parity.records.rows.encode_float` writes them."""
    return json.dumps({k: encode_float(v) if isinstance(v, float) else v for k, v in row.items()}) + "\n"


def _decode(row: dict) -> dict:
    """A row read back: float columns as floats (NaN and infinities included)."""
    return {k: parse_float(v) if k in FLOAT_COLUMNS else v for k, v in row.items()}


def _canonical(row: Mapping) -> str:
    """A row as one line that does not depend on how it was stored: each cell coerced to
    its schema type (`mhc_parity.records.rows.coerce_row`), columns in schema order."""
    return _typed_line(coerce_row(row, f"row of case {row.get('case')!r}"))


# Each schema column with its cell type, which decides how a canonical line writes the cell.
_LINE_CELLS = tuple(COLUMN_TYPES.items())
# json.dumps(..., allow_nan=False) makes an encoder per call; one does for every line.
_LINE_ENCODER = json.JSONEncoder(allow_nan=False)


def _typed_line(typed: Mapping) -> str:
    """`_canonical`'s line of a row whose cells have their schema types already."""
    cells = [
        encode_float(float(typed[c])) if kind is float else int(typed[c]) if kind is int else typed[c]
        for c, kind in _LINE_CELLS
    ]
    return _LINE_ENCODER.encode(cells)


def case_records(rows: Iterable[Mapping], cases: Sequence[str] = ()) -> dict[str, CaseRecord]:
    """Per case: its row count and the sha256 over its rows' canonical lines, sorted (so a
    report that orders rows otherwise than the stream has the same digest). `cases` with no
    row get a record of 0 rows. Raises `mhc_parity.records.rows.ReportInputError` for a row that does
    not fit the schema. Each row is digested with the cause its case named
    (`mhc_parity.records.cause_consistency.as_recorded`): the stream holds that, a finished
    run's files state the causes that hold across the run."""
    return _records(((str(row["case"]), _canonical(as_recorded(row))) for row in rows), cases)


def typed_case_records(typed_rows: Iterable[Mapping], cases: Sequence[str] = ()) -> dict[str, CaseRecord]:
    """`case_records` of rows whose cells have their schema types already, every schema
    column present: `coerce_row`'s records or a canonical frame's (`mhc_parity.records.rows.to_frame`,
    `frame.to_dict(orient="records")`), so they are not coerced again."""
    return _records(((str(row["case"]), _typed_line(as_recorded(row))) for row in typed_rows), cases)


def _records(lines_of_rows: Iterable[tuple[str, str]], cases: Sequence[str]) -> dict[str, CaseRecord]:
    """Per case: its row count and digest, from (case, canonical line) pairs."""
    lines: dict[str, list[str]] = {case: [] for case in cases}
    for case, line in lines_of_rows:
        lines.setdefault(case, []).append(line)
    records = {}
    for case, case_lines in lines.items():
        digest = hashlib.sha256("\n".join(sorted(case_lines)).encode()).hexdigest()
        records[case] = CaseRecord(case, len(case_lines), digest)
    return records


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

    def finished(self) -> tuple[list[dict], dict[str, CaseRecord]]:
        """Rows of the cases finished here and each such case's record (`case_records`),
        read without changing anything.

        Rows of a half-written case and a torn last line (a kill mid-write) are left
        out; StoreError if the stream holds anything else that is not a row.
        """
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
        """Continue the run here with just `rows`, of the finished `cases`, in the stream
        (see `finished`); reports go."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for path, text in (
            (self.rows_path, "".join(_encode(r) for r in rows)),
            (self.done_path, "".join(case + "\n" for case in cases)),
        ):
            atomic_write(path, text.encode())
        self.remove_reports()

    def append_case(self, case_name: str, rows: list[dict], *, record: CaseRecord | None = None) -> CaseRecord:
        """Write one case's rows, then mark the case finished; the case's record: `record`
        where the caller has it (`typed_case_records` of these rows), else computed here."""
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
    """Appending to `path`: if the append fails (a full disk), the file is cut back to where it
    ended, so it holds no torn line a resume would have to refuse."""
    size = path.stat().st_size if path.exists() else 0
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            os.truncate(path, size)
        raise
