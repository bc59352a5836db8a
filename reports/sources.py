"""Finding a run's rows on disk, whatever form they were saved in.

`load_run` accepts:
  * a run folder (uses `report.json`, else `rows.csv`, else `rows.jsonl` inside it);
  * a `report.json` written by `reports.write_all` (rows + metadata);
  * a baseline CSV (recognised by its header line, see `reports.baseline`);
  * a `.jsonl` row stream or a full-schema `.csv`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from reports.baseline import is_baseline_file, load_baseline
from reports.rows import ReportInputError, load_rows, to_frame

REPORT_FORMAT = "mhc-parity-report"
REPORT_FORMAT_VERSION = 1
# The metadata key under which the runner records the tolerance policy's hash.
POLICY_HASH_KEY = "policy_hash"
RUN_FOLDER_FILES = ("report.json", "rows.csv", "rows.jsonl")


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    """Rows of one run plus what is known about how they were produced."""

    frame: pd.DataFrame
    source: Path
    policy_hash: str | None
    metadata: dict  # a report's run metadata; a baseline's header environment
    is_baseline: bool

    def __len__(self) -> int:
        """The number of rows."""
        return len(self.frame)


def load_report_json(path: str | Path) -> tuple[pd.DataFrame, dict]:
    """The rows and metadata of a `report.json`; `ReportInputError` if it is not one."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportInputError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportInputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != REPORT_FORMAT:
        raise ReportInputError(f"{path}: not an mhc-parity report.json (no format={REPORT_FORMAT!r})")
    if document.get("format_version") != REPORT_FORMAT_VERSION:
        raise ReportInputError(
            f"{path}: report format version {document.get('format_version')!r} is not supported "
            f"(expected {REPORT_FORMAT_VERSION})"
        )
    rows = document.get("rows")
    if not isinstance(rows, list):
        raise ReportInputError(f"{path}: 'rows' must be a list")
    metadata = document.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ReportInputError(f"{path}: 'metadata' must be an object")
    return to_frame(rows, source=str(path)), metadata


def _policy_hash(metadata: dict) -> str | None:
    value = metadata.get(POLICY_HASH_KEY)
    return str(value) if value not in (None, "") else None


def load_run(path: str | Path) -> LoadedRun:
    """Load a run (folder or file, see the module docstring); `ReportInputError` on failure."""
    path = Path(path)
    if path.is_dir():
        for name in RUN_FOLDER_FILES:
            if (path / name).is_file():
                return load_run(path / name)
        raise ReportInputError(f"{path}: folder has none of {list(RUN_FOLDER_FILES)}")
    if not path.is_file():
        raise ReportInputError(f"{path}: no such file or folder")
    if is_baseline_file(path):
        baseline = load_baseline(path)
        return LoadedRun(baseline.frame, path, baseline.policy_hash, dict(baseline.environment), True)
    if path.suffix.lower() == ".json":
        frame, metadata = load_report_json(path)
        return LoadedRun(frame, path, _policy_hash(metadata), metadata, False)
    return LoadedRun(load_rows(path), path, None, {}, False)
