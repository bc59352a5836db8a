"""The committed baseline: a small, reviewable CSV of the columns the gate needs.

File layout (UTF-8, "\\n" line endings):

    # mhc-parity baseline format=2 policy_hash=<hash or -> backend=cpu device_kind=cpu ...
    case,candidate,partner,leaf,comparison,leaf_kind,dtype,verdict,nan_count,...
    <one line per row, sorted by (case, candidate, partner, leaf)>

The header is one line; after the environment record (`... matmul_precision=highest=float32`)
its last two keys, `rows=<n> body_sha256=<hex>`, record the body (every byte after the header line): its row
count and SHA-256. A baseline cut at a row boundary or edited by hand is refused, and so
is one whose lines have another field count, or whose compared row has a NaN, infinite or
empty error. The file is written to a temporary file, flushed and renamed over the old
one, so a failed write (a full disk, a file-size limit) leaves the old baseline whole.

Only `BASELINE_COLUMNS` are kept (no timings, no free text), errors are rounded to 4
significant digits (a rounding of at most 0.05 %, far below any growth factor the
gate uses), so regenerating a baseline on the same machine gives an empty diff and a
real change shows up as a few changed numbers. The header records the format version
and the hash of the tolerance policy the run used; the gate refuses (exit 2) a
baseline in another format or, when both runs record one, under another policy.
The header also records the run's backend, device kind and matmul precision
(`records.environment`; values URL-quoted, so a device kind may contain spaces); the
gate refuses a baseline made at another matmul precision. A header without the
precision was written before it was recorded: see the legacy rule of
`records.environment`.

A baseline of one external implementation (`harness baseline --impl`) keeps only that
implementation's rows and names it in the header (`implementation=<name>`, after the
environment keys); the gate then judges only that implementation's rows and refuses a
run without them (`reports.ownership`).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import math
import os
import tempfile
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from records.environment import HEADER_KEYS, environment_of
from records.rows import (
    ReportInputError,
    encode_float,
    frame_from_records,
    read_csv_cells,
    records_from_cells,
    unwrap_run,
)
from records.schema import COMPARED_VERDICTS, FLOAT_COLUMNS, IDENTITY_COLUMNS, INT_COLUMNS
from reports.drift import GATE_COLUMNS, GROWTH_METRICS, LEGACY_GATE_COLUMNS, gate_frame

BASELINE_COLUMNS = GATE_COLUMNS
BASELINE_FORMAT_VERSION = 2
# Format 1 lacked the oracle sensitivity (`reports.drift`); it is still read, as NaN.
COLUMNS_OF_FORMAT = {1: LEGACY_GATE_COLUMNS, BASELINE_FORMAT_VERSION: BASELINE_COLUMNS}
BASELINE_MAGIC = "# mhc-parity baseline"
SIGNIFICANT_DIGITS = 4
IMPLEMENTATION_KEY = "implementation"
# The header's record of its body: row count and SHA-256 (of every byte after the header line).
ROWS_KEY = "rows"
DIGEST_KEY = "body_sha256"
# Format 1 baselines were written before the row count and digest: read unverified.
INTEGRITY_SINCE_FORMAT = 2


@dataclasses.dataclass(frozen=True)
class Baseline:
    """A loaded baseline file: its rows (gate frame) and what its header records."""

    frame: pd.DataFrame
    format_version: int
    policy_hash: str | None
    path: Path
    # backend, device_kind, matmul_precision as far as the header records them
    environment: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # the external implementation whose rows it keeps (None: the built-in paths' baseline)
    implementation: str | None = None


def format_cell(column: str, value: Any) -> str:
    """One CSV cell of a baseline: floats to 4 significant digits, counts as ints."""
    if column in FLOAT_COLUMNS:
        number = float(value)
        if not math.isfinite(number):
            return str(encode_float(number))
        return f"{number:.{SIGNIFICANT_DIGITS}g}"
    if column in INT_COLUMNS:
        return str(int(value))
    return str(value)


def header_line(
    policy_hash: str | None,
    environment: Mapping[str, str] | None = None,
    implementation: str | None = None,
    integrity: tuple[int, str] | None = None,
) -> str:
    """The baseline's first line (format version, policy hash, the `HEADER_KEYS` given, the
    implementation it belongs to, and `integrity`: the body's row count and SHA-256)."""
    values = {**{key: (environment or {}).get(key) for key in HEADER_KEYS}, IMPLEMENTATION_KEY: implementation}
    if integrity is not None:
        values.update({ROWS_KEY: str(integrity[0]), DIGEST_KEY: integrity[1]})
    fields = "".join(f" {key}={urllib.parse.quote(str(value), safe='=,.:+')}" for key, value in values.items() if value)
    return f"{BASELINE_MAGIC} format={BASELINE_FORMAT_VERSION} policy_hash={policy_hash or '-'}{fields}"


def render_baseline(
    rows: pd.DataFrame | Iterable[Mapping[str, Any]],
    *,
    policy_hash: str | None = None,
    environment: Mapping[str, str] | None = None,
    implementation: str | None = None,
) -> str:
    """The baseline file's text for a row set (full rows or gate columns); with
    `implementation`, the header names the implementation the rows belong to."""
    frame = gate_frame(rows, source="baseline rows")
    frame = frame.sort_values(list(IDENTITY_COLUMNS), kind="mergesort")
    body = io.StringIO()
    writer = csv.writer(body, lineterminator="\n")
    writer.writerow(BASELINE_COLUMNS)
    for record in frame.to_dict(orient="records"):
        writer.writerow([format_cell(c, record[c]) for c in BASELINE_COLUMNS])
    integrity = (len(frame), body_digest(body.getvalue().encode("utf-8")))
    return header_line(policy_hash, environment, implementation, integrity) + "\n" + body.getvalue()


def body_digest(body: bytes) -> str:
    """The SHA-256 the header records of everything after the header line."""
    return hashlib.sha256(body).hexdigest()


def write_baseline(
    rows: pd.DataFrame | Iterable[Mapping[str, Any]],
    path: str | Path,
    *,
    policy_hash: str | None = None,
    implementation: str | None = None,
) -> Path:
    """Write `rows` as a baseline CSV at `path` (parents created); returns the path.

    `rows` may also be what `reports.load_run` or `load_baseline` returns; its
    recorded policy hash is then used unless `policy_hash` is given, and its recorded
    backend, device kind and matmul precision go into the header. `implementation`
    names the external implementation the rows belong to (the caller keeps only its
    rows: `reports.ownership.implementation_rows`).
    """
    path = Path(path)
    environment = environment_of(rows)
    rows, recorded_hash = unwrap_run(rows)
    text = render_baseline(
        rows, policy_hash=policy_hash or recorded_hash, environment=environment, implementation=implementation
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomically(path, text.encode("utf-8"))
    return path


def _replace_atomically(path: Path, data: bytes) -> None:
    """`path` holds `data` or, if writing fails (a full disk, a file-size limit), what it held
    before: written to a temporary file beside it, flushed to disk, then renamed over it."""
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def parse_header(line: str) -> dict[str, str] | None:
    """The key=value fields of a baseline header line, or None if `line` is not one."""
    if not line.startswith(BASELINE_MAGIC):
        return None
    fields = {}
    for token in line[len(BASELINE_MAGIC) :].split():
        key, _, value = token.partition("=")
        fields[key] = urllib.parse.unquote(value)
    return fields


# Header keys that describe the body rather than how it was made: a row change shows in the rows.
BODY_KEYS = (ROWS_KEY, DIGEST_KEY)


@dataclasses.dataclass(frozen=True)
class BaselineDiff:
    """What a new baseline text changes against an old one, row by row (row identity:
    case, candidate, partner, leaf), as cells the files hold (4 significant digits)."""

    added: tuple[tuple[str, ...], ...]
    removed: tuple[tuple[str, ...], ...]
    # (row key, ((column, old cell, new cell), ...)) for each row whose cells changed
    changed: tuple[tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]], ...]
    # (header key, old value, new value) for each header field that changed, less the body's record
    header: tuple[tuple[str, str, str], ...]
    rows: int  # in the new text

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.changed or self.header)


def _rows_by_key(text: str) -> dict[tuple[str, ...], dict[str, str]]:
    body = text.split("\n", 1)[1] if "\n" in text else ""
    return {tuple(row[c] for c in IDENTITY_COLUMNS): row for row in csv.DictReader(io.StringIO(body))}


def diff_baselines(old_text: str, new_text: str) -> BaselineDiff:
    """The rows `new_text` adds, removes and changes against `old_text` (two baseline
    files' texts; a column only one of them has compares as an empty cell), and the header
    fields it changes (the row count and body digest aside)."""
    old, new = _rows_by_key(old_text), _rows_by_key(new_text)
    changed = []
    for key in sorted(old.keys() & new.keys()):
        columns = [c for c in BASELINE_COLUMNS if c not in IDENTITY_COLUMNS]
        cells = tuple((c, old[key].get(c) or "", new[key].get(c) or "") for c in columns)
        moved = tuple(cell for cell in cells if cell[1] != cell[2])
        if moved:
            changed.append((key, moved))
    old_header = parse_header(old_text.split("\n", 1)[0]) or {}
    new_header = parse_header(new_text.split("\n", 1)[0]) or {}
    header = tuple(
        (k, old_header.get(k, ""), new_header.get(k, ""))
        for k in dict.fromkeys([*old_header, *new_header])
        if k not in BODY_KEYS and old_header.get(k, "") != new_header.get(k, "")
    )
    return BaselineDiff(
        added=tuple(sorted(new.keys() - old.keys())),
        removed=tuple(sorted(old.keys() - new.keys())),
        changed=tuple(changed),
        header=header,
        rows=len(new),
    )


def read_first_line(path: Path) -> str:
    """The first line of a text file without its line ending ("" for an empty file)."""
    try:
        with path.open(encoding="utf-8") as handle:
            return handle.readline().rstrip("\r\n")
    except UnicodeDecodeError:
        raise ReportInputError(f"{path}: not a UTF-8 text file") from None


def is_baseline_file(path: str | Path) -> bool:
    """True when `path` starts with a baseline header line."""
    path = Path(path)
    return path.is_file() and parse_header(read_first_line(path)) is not None


def _body(path: Path) -> bytes:
    """Every byte of the file after its header line (what the header's digest covers)."""
    data = path.read_bytes()
    return data[data.index(b"\n") + 1 :] if b"\n" in data else b""


def _check_integrity(path: Path, body: bytes, header: Mapping[str, str], rows: int) -> None:
    """ReportInputError unless the header's row count and body digest match the file: a
    baseline cut at a row boundary, or edited by hand, is not the one the writer wrote."""
    recorded_rows, recorded_digest = header.get(ROWS_KEY, ""), header.get(DIGEST_KEY, "")
    if not recorded_rows.isdigit() or not recorded_digest:
        raise ReportInputError(
            f"{path}: the baseline header records no row count and body digest (written by an older "
            f"harness, or edited); regenerate it with `make baseline`"
        )
    if int(recorded_rows) != rows:
        raise ReportInputError(
            f"{path}: the header records {recorded_rows} rows, the file holds {rows} (cut or edited); "
            f"regenerate it with `make baseline`"
        )
    if body_digest(body) != recorded_digest:
        raise ReportInputError(
            f"{path}: the rows do not match the header's digest (edited since it was written); "
            f"regenerate it with `make baseline`"
        )


def _check_row_widths(path: Path, body: bytes, width: int) -> None:
    """ReportInputError naming the first line whose field count is not the header's (a
    row cut short or run on: the CSV reader would fill or drop its cells silently)."""
    for number, fields in enumerate(csv.reader(io.StringIO(body.decode("utf-8"), newline="")), start=2):
        if fields and len(fields) != width:
            raise ReportInputError(
                f"{path}, line {number}: {len(fields)} fields, the baseline's columns are {width}; "
                f"regenerate it with `make baseline`"
            )


def _check_compared_metrics(records, path: Path) -> None:
    """ReportInputError for a compared row (pass/fail, not a lowering row: those measure
    nothing) whose error metrics are not finite numbers >= 0: the gate measures growth from
    them, and NaN would compare as no growth."""
    for number, record in enumerate(records, start=3):
        if record["verdict"] not in COMPARED_VERDICTS or record["comparison"] == "lowering":
            continue
        for column in GROWTH_METRICS:
            value = record[column]
            if not (math.isfinite(value) and value >= 0):
                raise ReportInputError(
                    f"{path}, line {number}, column {column!r}: a {record['verdict']} row needs a finite "
                    f"error >= 0, got {encode_float(value) or 'an empty cell'}; regenerate it with `make baseline`"
                )


def load_baseline(path: str | Path) -> Baseline:
    """Load and validate a baseline file; `ReportInputError` on any problem.

    Checks the header (present, known format version), the columns (exactly
    `BASELINE_COLUMNS`), every line's field count, every cell's type, a finite error on
    every compared row, the header's row count and body digest, and that row keys are unique.
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
    body = _body(path)
    _check_row_widths(path, body, len(columns))
    _check_compared_metrics(records, path)
    if version >= INTEGRITY_SINCE_FORMAT:
        _check_integrity(path, body, header, len(records))
    frame = gate_frame(frame_from_records(records, columns), source=str(path))
    policy_hash = header.get("policy_hash") or None
    return Baseline(
        frame=frame,
        format_version=version,
        policy_hash=None if policy_hash == "-" else policy_hash,
        path=path,
        environment={key: header[key] for key in HEADER_KEYS if header.get(key)},
        implementation=header.get(IMPLEMENTATION_KEY) or None,
    )
