"""Reading a baseline file back: every check the format allows (docs/gate.md), then a `Baseline`."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from pathlib import Path

from mhc_parity.records.environment import HEADER_KEYS
from mhc_parity.records.rows import (
    ReportInputError,
    encode_float,
    frame_from_records,
    read_csv_cells,
    records_from_cells,
)
from mhc_parity.records.schema import COMPARED_VERDICTS, PROGRAM_COMPARISONS
from mhc_parity.reports.baseline import (
    BASELINE_MAGIC,
    BODY_DIGEST_KEY,
    COLUMNS_OF_FORMAT,
    DIGEST_KEY,
    HEX_DIGEST,
    IMPLEMENTATION_KEY,
    LEGACY_FORMATS,
    LEGACY_OPTION,
    NO_POLICY,
    POLICY_KEY,
    ROWS_KEY,
    SEALED_FORMATS,
    SUITE_KEY,
    Baseline,
    body_digest,
    file_digest,
    parse_header,
    selection_of,
)
from mhc_parity.reports.drift import GROWTH_METRICS, gate_frame

__all__ = ["is_baseline_file", "load_baseline", "read_first_line"]


def read_first_line(path: Path) -> str:
    """The first line of a text file without its line ending ("" for an empty file)."""
    try:
        with path.open(encoding="utf-8") as handle:
            return handle.readline().rstrip("\r\n")
    except UnicodeDecodeError:
        raise ReportInputError(f"{path}: not a UTF-8 text file") from None


def is_baseline_file(path: str | Path) -> bool:
    path = Path(path)
    return path.is_file() and parse_header(read_first_line(path)) is not None


def _split(path: Path) -> tuple[bytes, bytes]:
    data = path.read_bytes()
    head, _, body = data.partition(b"\n")
    return head, body


def _check_row_count(path: Path, header: Mapping[str, str], rows: int) -> None:
    """ReportInputError unless the header's row count is the file's: a file cut at a row boundary is named as such
    before its digest is checked."""
    recorded = header.get(ROWS_KEY, "")
    if recorded.isdigit() and int(recorded) != rows:
        raise ReportInputError(
            f"{path}: the header records {recorded} rows, the file holds {rows} (cut or edited); "
            f"regenerate it with `make baseline`"
        )


def _check_sealed(path: Path, head: bytes, body: bytes, header: Mapping[str, str], rows: int) -> None:
    """ReportInputError unless the header ends in the row count and a `file_digest` that match the file (not cut, no row
    or header field edited)."""
    covered, sep, digest = head.rpartition(f" {DIGEST_KEY}=".encode())
    if not sep or not HEX_DIGEST.fullmatch(digest.decode("ascii", "replace")) or not header.get(ROWS_KEY, "").isdigit():
        raise ReportInputError(
            f"{path}: the baseline header does not end in its row count and `{DIGEST_KEY}=` digest (edited?); "
            f"regenerate it with `make baseline`"
        )
    _check_row_count(path, header, rows)
    if file_digest(covered, body) != digest.decode("ascii"):
        raise ReportInputError(
            f"{path}: the file does not match the header's digest (its header or rows were edited since "
            f"it was written); regenerate it with `make baseline`"
        )


def _check_body_digest(path: Path, body: bytes, header: Mapping[str, str], rows: int) -> None:
    """Format 2's check: row count and body digest (its header is not covered: read only as legacy)."""
    recorded_rows, recorded_digest = header.get(ROWS_KEY, ""), header.get(BODY_DIGEST_KEY, "")
    if not recorded_rows.isdigit() or not recorded_digest:
        raise ReportInputError(
            f"{path}: the baseline header records no row count and body digest (written by an older "
            f"harness, or edited); regenerate it with `make baseline`"
        )
    _check_row_count(path, header, rows)
    if body_digest(body) != recorded_digest:
        raise ReportInputError(
            f"{path}: the rows do not match the header's digest (edited since it was written); "
            f"regenerate it with `make baseline`"
        )


def _check_row_widths(path: Path, body: bytes, width: int) -> None:
    """ReportInputError at the first line whose field count is not the header's (the CSV reader would fill or drop its
    cells silently)."""
    for number, fields in enumerate(csv.reader(io.StringIO(body.decode("utf-8"), newline="")), start=2):
        if fields and len(fields) != width:
            raise ReportInputError(
                f"{path}, line {number}: {len(fields)} fields, the baseline's columns are {width}; "
                f"regenerate it with `make baseline`"
            )


def _check_compared_metrics(records, path: Path) -> None:
    """ReportInputError for a compared row (pass/fail, not a program row) whose error metrics are not finite and >= 0:
    the gate measures growth from them, and NaN would read as no growth."""
    for number, record in enumerate(records, start=3):
        if record["verdict"] not in COMPARED_VERDICTS or record["comparison"] in PROGRAM_COMPARISONS:
            continue
        for column in GROWTH_METRICS:
            value = record[column]
            if not (math.isfinite(value) and value >= 0):
                raise ReportInputError(
                    f"{path}, line {number}, column {column!r}: a {record['verdict']} row needs a finite "
                    f"error >= 0, got {encode_float(value) or 'an empty cell'}; regenerate it with `make baseline`"
                )


def _policy_of(path: Path, header: Mapping[str, str], version: int) -> str | None:
    """The header's policy hash; None for a legacy file without one; ReportInputError for a sealed format without
    one."""
    policy_hash = header.get(POLICY_KEY) or NO_POLICY
    if policy_hash != NO_POLICY:
        return policy_hash
    if version in LEGACY_FORMATS:
        return None
    raise ReportInputError(
        f"{path}: the baseline header records no tolerance policy ({POLICY_KEY}={NO_POLICY}), so a policy change "
        f"could not be noticed; regenerate it with `make baseline`"
    )


def load_baseline(path: str | Path, *, allow_legacy: bool = False, legacy_option: str = LEGACY_OPTION) -> Baseline:
    """Load and validate a baseline file; ReportInputError on any problem.

    Checks the header (format, policy hash), the columns of its format, every line's field count and cell types, a
    finite error on every compared row, the row count and digest. A legacy format (`LEGACY_FORMATS`) is refused unless
    `allow_legacy`, naming `legacy_option`; its body digest is still checked, and `Baseline.note` says what was not.
    """
    path = Path(path)
    if not path.is_file():
        raise ReportInputError(f"{path}: no such baseline file")
    header = parse_header(read_first_line(path))
    if header is None:
        raise ReportInputError(f"{path}: not a baseline file (first line must start with {BASELINE_MAGIC!r})")
    version_text = header.get("format", "")
    if not version_text.isdigit():
        raise ReportInputError(f"{path}: baseline header has no valid format version")
    version = int(version_text)
    if version not in COLUMNS_OF_FORMAT:
        raise ReportInputError(
            f"{path}: baseline format {version} is not supported (expected one of "
            f"{sorted(COLUMNS_OF_FORMAT)}); regenerate it with `make baseline`"
        )
    if version in LEGACY_FORMATS and not allow_legacy:
        raise ReportInputError(
            f"{path}: baseline format {version} is a legacy format ({LEGACY_FORMATS[version]}), read only with "
            f"{legacy_option}; regenerate it with `make baseline`"
        )
    columns = COLUMNS_OF_FORMAT[version]
    cells = read_csv_cells(path, skip_lines=1)
    if list(cells.columns) != list(columns):
        missing = [c for c in columns if c not in cells.columns]
        unknown = [c for c in cells.columns if c not in columns]
        raise ReportInputError(
            f"{path}: baseline columns do not match format {version} (missing {missing}, unknown {unknown}; "
            f"order must be {list(columns)}); regenerate it with `make baseline`"
        )
    # Line 1 is the header comment, line 2 the column names.
    records = records_from_cells(cells, path, columns, first_data_line=3)  # a bad cell names itself first
    head, body = _split(path)
    _check_row_widths(path, body, len(columns))
    _check_compared_metrics(records, path)
    if version in SEALED_FORMATS:
        _check_sealed(path, head, body, header, len(records))
    elif version == 2:
        _check_body_digest(path, body, header, len(records))
    policy_hash = _policy_of(path, header, version)
    frame = gate_frame(frame_from_records(records, columns), source=str(path))
    return Baseline(
        frame=frame,
        format_version=version,
        policy_hash=policy_hash,
        path=path,
        environment={key: header[key] for key in HEADER_KEYS if header.get(key)},
        implementation=header.get(IMPLEMENTATION_KEY) or None,
        suite=header.get(SUITE_KEY) or None,
        selection=selection_of(frame, header),
    )
