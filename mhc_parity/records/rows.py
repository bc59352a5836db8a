"""Row sets in and out: validation, type coercion and file loading.

Every report and the gate work on a DataFrame whose columns are exactly `ROW_COLUMNS` in schema order: floats float64
(NaN where a metric does not apply), counts int64, text str. `to_frame` builds it from row dicts or a DataFrame,
`load_rows` from a `.jsonl` stream or a `rows.csv`. Misfits raise `ReportInputError` naming the source and the line or
column.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mhc_parity.records.schema import (  # ReportInputError: read from here by every reader
    COLUMN_TYPES,
    COMPARISONS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    LATER_COLUMNS,
    LEAF_KINDS,
    ROW_COLUMNS,
    VERDICTS,
    ReportInputError,
)

# "" is allowed for comparison and leaf_kind: an error row raised before the leaf was known lacks them.
_VOCABULARIES: dict[str, tuple[str, ...]] = {
    "verdict": VERDICTS,
    "comparison": COMPARISONS + ("",),
    "leaf_kind": LEAF_KINDS + ("",),
}


# ----------------------------------------------------------------------------- values


# Digits required after a decimal point and an exponent: float() takes "3.", so a number cut there would parse.
_COMPLETE_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?")
_NON_FINITE = frozenset({"nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})


def _number_text(text: str) -> float:
    """float(text) for a complete number or a non-finite name; ValueError naming the text."""
    if _COMPLETE_NUMBER.fullmatch(text) or text.lower() in _NON_FINITE:
        return float(text)
    raise ValueError(f"{text!r} is not a complete number")


def parse_float(value: Any) -> float:
    """A float from a JSON/CSV cell: None and "" are NaN; "inf"/"Infinity"/"nan" parse. ValueError for an incomplete
    number ("3.", "1e": a file cut mid-number), booleans and other non-numbers."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    if text == "":
        return math.nan
    return _number_text(text)


def parse_count(value: Any) -> int:
    """A non-negative integer count from a JSON/CSV cell (an integral float is accepted)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"expected a count, got {value!r}")
    if isinstance(value, int):
        number = value
    else:
        as_float = _number_text(str(value).strip()) if not isinstance(value, float) else value
        if not math.isfinite(as_float) or as_float != int(as_float):
            raise ValueError(f"expected a whole number, got {value!r}")
        number = int(as_float)
    if number < 0:
        raise ValueError(f"expected a non-negative count, got {value!r}")
    return number


def parse_text(value: Any) -> str:
    return "" if value is None else str(value)


def is_finite(value: Any) -> bool:
    """True for a real, finite number (NaN, inf, None and text are not)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- frames


def _check_columns(columns: Iterable[str], where: str, expected: Sequence[str] = ROW_COLUMNS) -> None:
    present = list(columns)
    if _columns_fit(tuple(present), tuple(expected)):
        return
    duplicated = sorted({c for c in present if present.count(c) > 1})
    missing = [c for c in expected if c not in present and c not in LATER_COLUMNS]
    unknown = [c for c in present if c not in expected]
    problems = []
    if missing:
        problems.append(f"missing columns {missing}")
    if unknown:
        problems.append(f"unknown columns {unknown}")
    if duplicated:
        problems.append(f"duplicated columns {duplicated}")
    if problems:
        raise ReportInputError(f"{where}: " + "; ".join(problems))


@functools.lru_cache(maxsize=64)
def _columns_fit(present: tuple[str, ...], expected: tuple[str, ...]) -> bool:
    """Whether `present` are `expected`, each once, less any `LATER_COLUMNS`; cached per column set (every row of a run
    has the same)."""
    names = set(present)
    return len(names) == len(present) and names <= set(expected) and set(expected) - names <= set(LATER_COLUMNS)


def coerce_row(row: Mapping[str, Any], where: str, columns: Sequence[str] = ROW_COLUMNS) -> dict:
    """One row with every cell converted to its schema type (a missing `LATER_COLUMNS` cell is empty); errors name
    `where` and the column."""
    coerced: dict[str, Any] = {}
    for column, later, parse, vocabulary in _coercion_plan(tuple(columns)):
        value = row.get(column, "") if later else row[column]
        try:
            cell = parse(value)
        except (TypeError, ValueError) as exc:
            raise ReportInputError(f"{where}, column {column!r}: {exc}") from None
        if vocabulary is not None and cell not in vocabulary:
            allowed = [v for v in vocabulary if v]
            raise ReportInputError(f"{where}, column {column!r}: {cell!r} is not one of {allowed}")
        coerced[column] = cell
    return coerced


_CELL_PARSERS = {float: parse_float, int: parse_count, str: parse_text}


@functools.lru_cache(maxsize=8)
def _coercion_plan(columns: tuple[str, ...]) -> tuple[tuple[str, bool, Any, tuple[str, ...] | None], ...]:
    """Per column: (name, may a row lack it, cell parser, vocabulary or None), once per column set."""
    return tuple(
        (
            column,
            column in LATER_COLUMNS,
            _CELL_PARSERS[COLUMN_TYPES.get(column, str)],
            _VOCABULARIES.get(column),
        )
        for column in columns
    )


def frame_from_records(records: Sequence[dict], columns: Sequence[str] = ROW_COLUMNS) -> pd.DataFrame:
    """A typed DataFrame from already-coerced records (float64 / int64 / str columns)."""
    data: dict[str, pd.Series] = {}
    for column in columns:
        values = [record[column] for record in records]
        if column in FLOAT_COLUMNS:
            data[column] = pd.Series(values, dtype="float64")
        elif column in INT_COLUMNS:
            data[column] = pd.Series(values, dtype="int64")
        else:
            data[column] = pd.Series(values, dtype="object").astype("str")
    return pd.DataFrame(data, columns=list(columns))


def to_frame(rows: pd.DataFrame | Iterable[Mapping[str, Any]], *, source: str = "rows") -> pd.DataFrame:
    """The canonical typed frame for a row set (a DataFrame or row dicts): columns exactly `ROW_COLUMNS` (any order in,
    schema order out; `LATER_COLUMNS` may be absent). ReportInputError names the row and column of the first bad cell.
    """
    if isinstance(rows, pd.DataFrame):
        _check_columns(rows.columns, source)
        records = rows.to_dict(orient="records")
        coerced = [coerce_row(r, f"{source}, row {i}") for i, r in enumerate(records)]
        return frame_from_records(coerced)
    return frame_from_records(typed_rows(rows, source=source))


def typed_rows(rows: Iterable[Mapping[str, Any]], *, source: str = "rows") -> list[dict]:
    """Row dicts coerced and checked as `to_frame` does (`frame_from_records` of these is `to_frame(rows)`), for callers
    that need the typed rows first."""
    coerced = []
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ReportInputError(f"{source}, row {index}: expected a dict, got {type(row).__name__}")
        _check_columns(row.keys(), f"{source}, row {index}")
        coerced.append(coerce_row(row, f"{source}, row {index}"))
    return coerced


def unwrap_run(rows: Any) -> tuple[Any, str | None]:
    """(rows, policy_hash) from a loaded run (`LoadedRun`, `Baseline`) or plain rows (hash None)."""
    frame = getattr(rows, "frame", None)
    if isinstance(frame, pd.DataFrame):
        return frame, getattr(rows, "policy_hash", None)
    return rows, None


# ----------------------------------------------------------------------------- files


def _load_jsonl(path: Path) -> pd.DataFrame:
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ReportInputError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ReportInputError(f"{where}: expected a JSON object, got {type(row).__name__}")
            _check_columns(row.keys(), where)
            records.append(coerce_row(row, where))
    return frame_from_records(records)


def _check_not_cut(path: Path) -> None:
    """ReportInputError if the last line has no line ending: the writers end every line, so the file was cut."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReportInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if data and not data.endswith(b"\n"):
        last_line = data.count(b"\n") + 1
        raise ReportInputError(f"{path}, line {last_line}: the file is cut (its last line has no line ending)")


def read_csv_cells(path: Path, *, skip_lines: int = 0) -> pd.DataFrame:
    """A CSV file as an all-text DataFrame (no NA guessing), or ReportInputError."""
    try:
        return pd.read_csv(
            path,
            dtype=str,
            keep_default_na=False,
            na_filter=False,
            skiprows=skip_lines,
        )
    except pd.errors.EmptyDataError:
        raise ReportInputError(f"{path}: empty file (no header line)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise ReportInputError(f"{path}: not a readable CSV file ({exc})") from None


def records_from_cells(cells: pd.DataFrame, path: Path, columns: Sequence[str], *, first_data_line: int) -> list[dict]:
    """Coerced records from an all-text frame; errors name each row's file line (and column), then a cut last line
    (`_check_not_cut`)."""
    _check_columns(cells.columns, str(path), columns)
    records = [
        coerce_row(row, f"{path}, line {first_data_line + index}", columns)
        for index, row in enumerate(cells.to_dict(orient="records"))
    ]
    _check_not_cut(path)
    return records


def _load_csv(path: Path) -> pd.DataFrame:
    cells = read_csv_cells(path)
    # Line 1 is the header, so data row i sits on line i + 2 (quoted newlines aside).
    return frame_from_records(records_from_cells(cells, path, ROW_COLUMNS, first_data_line=2))


def load_rows(path: str | Path) -> pd.DataFrame:
    """Load a `.jsonl` (the runner's stream; blank lines ignored) or `.csv` row file. ReportInputError, naming the file
    and line or column, for a missing file, an unparsable line, wrong columns or a mistyped cell."""
    path = Path(path)
    if not path.is_file():
        raise ReportInputError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _load_jsonl(path)
    if suffix == ".csv":
        return _load_csv(path)
    raise ReportInputError(f"{path}: unsupported row file type {suffix!r} (expected .jsonl or .csv)")


# ----------------------------------------------------------------------------- writing numbers


def encode_float(value: float) -> float | str:
    """A float as every file the harness writes holds it: finite as is, NaN "nan", infinities "inf" / "-inf" (JSON has
    no literal for them). `parse_float` also reads the older null, empty cell and "Infinity"/"-Infinity"."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def json_ready(value: Any) -> Any:
    """`value` converted to strict-JSON-compatible Python (non-finite floats, paths, numpy scalars...)."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [json_ready(v) for v in items]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return encode_float(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        try:
            return json_ready(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def frame_to_json_records(frame: pd.DataFrame) -> list[dict]:
    """Rows as strict-JSON-safe dicts (`encode_float`), converted a column at a time: per-cell type tests were most of a
    report's JSON time."""
    columns = list(frame.columns)
    converted = [_json_column(column, frame[column]) for column in columns]
    return [dict(zip(columns, values)) for values in zip(*converted)]


def _json_column(column: str, values: pd.Series) -> list:
    if column in FLOAT_COLUMNS:
        return [encode_float(v) for v in values.to_numpy(dtype=np.float64).tolist()]
    if column in INT_COLUMNS:
        return values.to_numpy(dtype=np.int64).tolist()
    return [str(v) for v in values.tolist()]
