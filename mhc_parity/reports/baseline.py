"""The committed baseline: a small, reviewable CSV of the columns the gate needs (`BASELINE_COLUMNS`).

    # mhc-parity baseline format=5 policy_hash=<hash> backend=cpu device_kind=cpu ... rows=<n> sha256=<hex>
    case,candidate,partner,leaf,comparison,leaf_kind,dtype,verdict,nan_count,...
    <one line per row, sorted by (case, candidate, partner, leaf)>

Errors are rounded to 4 significant digits, so regenerating on one machine gives an empty diff. The header's last field
is the SHA-256 of the whole file without it, so an edited header or row is refused; it is written atomically, never over
a run folder's own file. Header fields, older formats and what the gate refuses: docs/gate.md.
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
    unwrap_run,
)
from mhc_parity.records.schema import (
    FLOAT_COLUMNS,
    IDENTITY_COLUMNS,
    INT_COLUMNS,
)
from mhc_parity.records.store import DONE_FILE, ROWS_FILE
from mhc_parity.reports.causes import uncompared
from mhc_parity.reports.drift import GATE_COLUMNS, LEGACY_GATE_COLUMNS, PRE_GAIN_GATE_COLUMNS, gate_frame

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


# Header keys that describe the body rather than how it was made: a row change shows in the rows.
BODY_KEYS = (ROWS_KEY, DIGEST_KEY, BODY_DIGEST_KEY)


@dataclasses.dataclass(frozen=True)
class BaselineDiff:
    """What a new baseline text changes against an old one, row by row (by row identity), as the cells the files
    hold."""

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
    """Rows `new_text` adds, removes and changes against `old_text` (a column only one has compares as empty), and the
    header fields it changes (row count and digests aside)."""
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
