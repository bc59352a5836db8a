"""The committed baseline: a small, reviewable CSV of the columns the gate needs (`BASELINE_COLUMNS`).

    # mhc-parity baseline format=5 policy_hash=<hash> backend=cpu device_kind=cpu ... rows=<n> sha256=<hex>
    case,candidate,partner,leaf,comparison,leaf_kind,dtype,verdict,nan_count,...
    <one line per row, sorted by (case, candidate, partner, leaf)>

Errors are rounded to 4 significant digits, so regenerating on one machine gives an empty diff. The header's last field
is the SHA-256 of the whole file without it, so an edited header or row is refused; it is written atomically, never over
a run folder's own file. Written (`write_baseline`) and read back, with every check the format allows (`load_baseline`)
or none (`unchecked_rows`), here only. Header fields, older formats and what the gate refuses: docs/gate.md.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import math
import os
import re
import tempfile
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from mhc_parity.records.environment import HEADER_KEYS, environment_of
from mhc_parity.records.identity import Selection
from mhc_parity.records.manifest import MANIFEST_FILE, REPORT_FILES
from mhc_parity.records.rows import (
    ReportInputError,
    encode_float,
    frame_from_records,
    read_csv_cells,
    records_from_cells,
    unwrap_run,
)
from mhc_parity.records.schema import (
    COMPARED_VERDICTS,
    FLOAT_COLUMNS,
    IDENTITY_COLUMNS,
    INT_COLUMNS,
    PROGRAM_COMPARISONS,
)
from mhc_parity.records.store import DONE_FILE, ROWS_FILE
from mhc_parity.reports.causes import uncompared
from mhc_parity.reports.gate.drift import GROWTH_METRICS
from mhc_parity.reports.gate.rule import GATE_COLUMNS, LEGACY_GATE_COLUMNS, PRE_GAIN_GATE_COLUMNS, gate_frame

BASELINE_COLUMNS = GATE_COLUMNS
BASELINE_FORMAT_VERSION = 5
# Missing columns read as NaN: format 1 lacks the oracle sensitivity, 2 and 3 the oracle gain
# (format 3 is sealed, so still read without legacy consent, minus the systematic-shift rule).
COLUMNS_OF_FORMAT = {
    1: LEGACY_GATE_COLUMNS,
    2: PRE_GAIN_GATE_COLUMNS,
    3: PRE_GAIN_GATE_COLUMNS,
    4: BASELINE_COLUMNS,
    BASELINE_FORMAT_VERSION: BASELINE_COLUMNS,
}
# The formats whose header digest covers every header field and row (`file_digest`).
SEALED_FORMATS = (3, 4, BASELINE_FORMAT_VERSION)
# The formats read only when the reader allows legacy baselines, and what each leaves unverified.
LEGACY_FORMATS = {
    1: "its rows and header are covered by no digest",
    2: "its digest covers the rows but not the header: policy hash, implementation, backend, matmul precision",
}
LEGACY_OPTION = "--allow-legacy-baseline"
BASELINE_MAGIC = "# mhc-parity baseline"
SIGNIFICANT_DIGITS = 4
IMPLEMENTATION_KEY = "implementation"
SUITE_KEY = "suite"
# Format 5's record of the selection beyond its rows: external implementations ("none"), "yes"/"no".
IMPLEMENTATIONS_KEY = "implementations"
LOWERING_KEY = "lowering"
ENVELOPE_KEY = "inside_envelope"
NO_IMPLEMENTATIONS = "none"
POLICY_KEY = "policy_hash"
# A header without a policy (formats 1 and 2 only).
NO_POLICY = "-"
ROWS_KEY = "rows"
DIGEST_KEY = "sha256"
# Format 2's digest: of the body alone (every byte after the header line).
BODY_DIGEST_KEY = "body_sha256"
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
# A run folder's files its manifest vouches for: a baseline written over one would pass as the run's.
RUN_FOLDER_FILES = (MANIFEST_FILE, ROWS_FILE, DONE_FILE, *REPORT_FILES.values())


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
    # the suite its rows were selected from (`mhc_parity.records.run_suite`); None: not recorded
    suite: str | None = None
    # what its rows cover (`selection_of`)
    selection: Selection | None = None

    @property
    def unverified(self) -> str:
        """What reading the file could not verify ("" for a sealed format with a policy): a legacy format read because
        the reader allowed it."""
        parts = [LEGACY_FORMATS[self.format_version]] if self.format_version in LEGACY_FORMATS else []
        if self.policy_hash is None:
            parts.append("it records no tolerance policy, so the policy was not checked")
        return "; ".join(parts)

    @property
    def note(self) -> str:
        """The line printed beside a verdict against this baseline ("" when nothing went unverified)."""
        if not self.unverified:
            return ""
        return f"note: baseline {self.path} is in legacy format {self.format_version}: {self.unverified}"


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
    rows: int | None = None,
    suite: str | None = None,
    selection: Selection | None = None,
) -> str:
    """The baseline's first line up to its digest (format, policy hash, `HEADER_KEYS`, implementation, suite,
    `selection_fields`, row count), which `sealed` completes."""
    values = {
        **{key: (environment or {}).get(key) for key in HEADER_KEYS},
        IMPLEMENTATION_KEY: implementation,
        SUITE_KEY: suite,
        **selection_fields(selection),
    }
    if rows is not None:
        values[ROWS_KEY] = str(rows)
    fields = "".join(f" {key}={urllib.parse.quote(str(value), safe='=,.:+')}" for key, value in values.items() if value)
    return f"{BASELINE_MAGIC} format={BASELINE_FORMAT_VERSION} {POLICY_KEY}={policy_hash or NO_POLICY}{fields}"


def selection_fields(selection: Selection | None) -> dict[str, str]:
    """Format 5's header fields for `selection` ({} for None: the rows alone say what they cover)."""
    if selection is None:
        return {}
    fields = {IMPLEMENTATIONS_KEY: ",".join(selection.implementations) or NO_IMPLEMENTATIONS}
    for key, value in ((LOWERING_KEY, selection.lowering), (ENVELOPE_KEY, selection.inside_envelope)):
        if value is not None:
            fields[key] = "yes" if value else "no"
    return fields


def selection_of(frame: pd.DataFrame, header: Mapping[str, str]) -> Selection:
    """What a baseline covers: cases and paths from its rows; implementations, lowering and envelope from a format-5
    header, else the implementations its paths name."""
    recorded = {}
    if header.get(IMPLEMENTATIONS_KEY):
        names = header[IMPLEMENTATIONS_KEY]
        recorded["implementations"] = () if names == NO_IMPLEMENTATIONS else tuple(names.split(","))
    for name, key in (("lowering", LOWERING_KEY), ("inside_envelope", ENVELOPE_KEY)):
        if header.get(key) in ("yes", "no"):
            recorded[name] = header[key] == "yes"
    return Selection.of_rows(frame, **recorded)


def file_digest(header: bytes, body: bytes) -> str:
    """The SHA-256 a sealed header records: of every byte of the file but ` sha256=<hex>`."""
    return hashlib.sha256(header + b"\n" + body).hexdigest()


def sealed(header: str, body: str) -> str:
    """The file's text: `header` (a `header_line`) completed with the digest of it and `body`."""
    digest = file_digest(header.encode("utf-8"), body.encode("utf-8"))
    return f"{header} {DIGEST_KEY}={digest}\n{body}"


def render_baseline(
    rows: pd.DataFrame | Iterable[Mapping[str, Any]],
    *,
    policy_hash: str | None = None,
    environment: Mapping[str, str] | None = None,
    implementation: str | None = None,
    suite: str | None = None,
    selection: Selection | None = None,
) -> str:
    """The baseline file's text for a row set (full rows or gate columns). ReportInputError without a `policy_hash`:
    every reader refuses a baseline naming no policy."""
    if not policy_hash or policy_hash == NO_POLICY:
        raise ReportInputError(
            "a baseline records the tolerance policy its rows were judged under, and none was given "
            "(pass policy_hash=, or write it from a run)"
        )
    frame = gate_frame(rows, source="baseline rows")
    frame = frame.sort_values(list(IDENTITY_COLUMNS), kind="mergesort")
    body = io.StringIO()
    writer = csv.writer(body, lineterminator="\n")
    writer.writerow(BASELINE_COLUMNS)
    for record in frame.to_dict(orient="records"):
        writer.writerow([format_cell(c, record[c]) for c in BASELINE_COLUMNS])
    header = header_line(policy_hash, environment, implementation, rows=len(frame), suite=suite, selection=selection)
    return sealed(header, body.getvalue())


def body_digest(body: bytes) -> str:
    """The SHA-256 a format-2 header records: of everything after the header line."""
    return hashlib.sha256(body).hexdigest()


def run_folder_refusal(path: str | Path) -> str:
    """Why a baseline must not be written at `path` ("" if it may): it is one of a run folder's own files
    (`RUN_FOLDER_FILES`), which the run's manifest vouches for."""
    path = Path(path).resolve()
    if path.name not in RUN_FOLDER_FILES or not (path.parent / MANIFEST_FILE).exists():
        return ""
    return (
        f"{path} is the {path.name} of the run folder {path.parent}; a baseline must not replace a "
        f"run's own file: write it outside the run folder (e.g. baselines/<name>.csv)"
    )


def nothing_compared_refusal(rows: pd.DataFrame | Iterable[Mapping[str, Any]], implementation: str | None) -> str:
    """Why `rows` cannot be a baseline (of `implementation`, or of the built-in paths): every row of it is
    skip/unsupported, or there is none; "" otherwise."""
    records = rows.to_dict(orient="records") if isinstance(rows, pd.DataFrame) else list(rows)
    if not uncompared(records, [implementation] if implementation else []):
        return ""
    owner = f"implementation {implementation!r}" if implementation else "the run"
    reasons = list(dict.fromkeys(r["reason"] for r in records if isinstance(r.get("reason"), str) and r["reason"]))
    example = f" (e.g. {reasons[0]})" if reasons else ""
    return (
        f"no row of {owner} compared anything: its {len(records)} rows are skip/unsupported{example}; "
        "refusing a baseline that would gate nothing"
    )


def write_baseline(
    rows: pd.DataFrame | Iterable[Mapping[str, Any]],
    path: str | Path,
    *,
    policy_hash: str | None = None,
    implementation: str | None = None,
    suite: str | None = None,
    selection: Selection | None = None,
) -> Path:
    """Write `rows` as a baseline CSV at `path` (parents created); returns the path.

    `rows` may be a loaded run or baseline: its policy hash (unless `policy_hash` is given) and environment go into the
    header. `implementation`: the external implementation the rows (already filtered) belong to; `suite`: the suite they
    were selected from. ReportInputError for a run folder's own file (`run_folder_refusal`), no policy hash, or rows
    that compared nothing (`nothing_compared_refusal`: such a baseline gates nothing).
    """
    path = Path(path)
    refusal = run_folder_refusal(path)
    if refusal:
        raise ReportInputError(refusal)
    environment = environment_of(rows)
    rows, recorded_hash = unwrap_run(rows)
    rows = rows if isinstance(rows, pd.DataFrame) else list(rows)
    refusal = nothing_compared_refusal(rows, implementation)
    if refusal:
        raise ReportInputError(refusal)
    text = render_baseline(
        rows,
        policy_hash=policy_hash or recorded_hash,
        environment=environment,
        implementation=implementation,
        suite=suite,
        selection=selection,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomically(path, text.encode("utf-8"))
    return path


def _replace_atomically(path: Path, data: bytes) -> None:
    """`path` holds `data` or, if writing fails, what it held before (temporary file, fsync, rename)."""
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


def unchecked_rows(text: str) -> list[dict[str, str]]:
    """A baseline text's rows as their cells by column, read without a check (a file about to be replaced, or compared
    with its replacement)."""
    body = text.split("\n", 1)[1] if "\n" in text else ""
    return list(csv.DictReader(io.StringIO(body)))


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
