"""Finding a run's rows on disk, and refusing rows that cannot be trusted (`ReportInputError`, one line saying why and
how to finish or redo the run).

`load_run` accepts a run folder whose `manifest.json` says "complete" and whose `report.json` (and row stream, if any)
holds exactly the recorded rows; a `report.json` carrying such a manifest (and matching any manifest beside it); a
`.jsonl` or `.csv` row file only inside such a folder. A baseline CSV is not a run (no manifest says what code made it);
`load_baseline_or_run` reads either where a baseline is asked for.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from mhc_parity.records.identity import Selection
from mhc_parity.records.manifest import (
    MANIFEST_FILE,
    REPORT_FILES,
    Manifest,
    ManifestError,
    format_problem,
    read_manifest,
)
from mhc_parity.records.rows import ReportInputError, load_rows, to_frame
from mhc_parity.records.store import RowStore, StoreError, typed_case_records
from mhc_parity.reports.gate.baseline_file import LEGACY_OPTION, Baseline, is_baseline_file, load_baseline

REPORT_FORMAT = "mhc-parity-report"
REPORT_FORMAT_VERSION = 1
# The metadata key under which the runner records the tolerance policy's hash.
POLICY_HASH_KEY = "policy_hash"
# The report.json key holding the run's manifest.
MANIFEST_KEY = "manifest"
CODE_CHANGE_OPTION = "--allow-code-change"


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    """Rows of one run plus what is known about how they were made. manifest: None for a baseline file."""

    frame: pd.DataFrame
    source: Path
    policy_hash: str | None
    metadata: dict  # a report's run metadata; a baseline's header environment
    is_baseline: bool
    manifest: Manifest | None = None
    # a baseline file's implementation (`mhc_parity.reports.gate.comparability`); None for runs and built-in baselines
    implementation: str | None = None
    # what a legacy baseline's digest did not vouch for, as a line to print (`Baseline.note`); "" if nothing
    note: str = ""
    # a baseline file's record of what it covers (`Baseline.selection`); None for runs (their manifest says)
    recorded_selection: Selection | None = None

    def __len__(self) -> int:
        return len(self.frame)


def load_report_json(path: str | Path) -> tuple[pd.DataFrame, dict, Manifest | None]:
    """The rows, metadata and manifest (None if absent) of a `report.json`; ReportInputError if it is not one."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportInputError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportInputError(f"{path}: not valid JSON ({exc})") from None
    problem = format_problem(document, name=REPORT_FORMAT, version=REPORT_FORMAT_VERSION, what="report.json")
    if problem:
        raise ReportInputError(f"{path}: {problem}")
    rows = document.get("rows")
    if not isinstance(rows, list):
        raise ReportInputError(f"{path}: 'rows' must be a list")
    metadata = document.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ReportInputError(f"{path}: 'metadata' must be an object")
    manifest = None
    if document.get(MANIFEST_KEY) is not None:
        manifest = _checked(lambda: Manifest.from_json(document[MANIFEST_KEY], f"{path} ({MANIFEST_KEY})"))
    return to_frame(rows, source=str(path)), metadata, manifest


def _checked(read):
    try:
        return read()
    except ManifestError as exc:
        raise ReportInputError(str(exc)) from None


def _complete_manifest_of(folder: Path) -> Manifest:
    manifest = _checked(lambda: read_manifest(folder))
    if manifest is None:
        raise ReportInputError(
            f"{folder}: no {MANIFEST_FILE}, so nothing says its run finished (a folder not written by "
            f"`mhc-parity run`, or by a version before manifests); rerun it"
        )
    _checked(lambda: manifest.require_complete(str(folder), folder))
    return manifest


def _check_rows_belong(rows, manifest: Manifest, where: Path) -> None:
    """ReportInputError unless the rows (a canonical frame, or a stream's case records) are exactly those the manifest
    recorded."""
    found = typed_case_records(rows.to_dict(orient="records")) if isinstance(rows, pd.DataFrame) else rows
    problem = manifest.rows_problem(found)
    if problem:
        raise ReportInputError(
            f"{where}: its rows are not those the run {manifest.run_id} recorded ({problem}): "
            f"the file was cut, edited or left from another run; rerun it"
        )


def _check_stream(folder: Path, manifest: Manifest) -> None:
    """The folder's row stream, if any, holds the recorded rows (as `--resume` and `merge` require)."""
    store = RowStore(folder)
    if not store.has_rows():
        return  # reports only (e.g. `mhc_parity.reports.samples`): their rows were checked
    try:
        _, found = store.finished()
    except StoreError as exc:
        raise ReportInputError(str(exc)) from None
    _check_rows_belong(found, manifest, store.rows_path)


def _load_report(path: Path) -> LoadedRun:
    frame, metadata, manifest = load_report_json(path)
    if manifest is None:
        raise ReportInputError(
            f"{path}: the report carries no run manifest (written before manifests, or not by "
            f"`mhc-parity run`), so nothing says its run finished; rerun it"
        )
    _checked(lambda: manifest.require_complete(str(path), path.parent))
    beside = _checked(lambda: read_manifest(path.parent))
    if beside is not None and (beside.run_id != manifest.run_id or not beside.is_complete):
        raise ReportInputError(
            f"{path}: stale report of run {manifest.run_id}; its folder now holds run {beside.run_id} "
            f"({beside.progress_text()})"
        )
    if beside is not None and beside != manifest:
        raise ReportInputError(
            f"{path}: the report and the {MANIFEST_FILE} beside it disagree about run {manifest.run_id}; rerun it"
        )
    _check_rows_belong(frame, manifest, path)
    if beside is not None:
        _check_stream(path.parent, manifest)
    return LoadedRun(frame, path, manifest.policy_digest, metadata, False, manifest)


def _load_rows_file(path: Path) -> LoadedRun:
    frame = load_rows(path)  # a malformed file is reported as such first
    if _checked(lambda: read_manifest(path.parent)) is None:
        raise ReportInputError(
            f"{path}: a bare rows file carries no manifest, so nothing says its run finished; "
            f"pass its run folder or its {REPORT_FILES['json']}"
        )
    manifest = _complete_manifest_of(path.parent)
    _check_rows_belong(frame, manifest, path)
    _check_stream(path.parent, manifest)
    return LoadedRun(frame, path, manifest.policy_digest, {}, False, manifest)


def check_current_code(run: LoadedRun, option: str = CODE_CHANGE_OPTION) -> None:
    """ReportInputError (one line, naming `option`, which lets it through) when `run` was made by other code than this
    checkout (`Manifest.changed_code_files`)."""
    changed = run.manifest.changed_code_files() if run.manifest is not None else []
    if changed:
        shown = ", ".join(changed[:4]) + (f" (+{len(changed) - 4} more)" if len(changed) > 4 else "")
        raise ReportInputError(
            f"{run.source}: the run was made by other code than this checkout (changed since: {shown}); "
            f"rerun it, or pass {option} to use it anyway"
        )


def load_run(path: str | Path, *, require_current_code: bool = False) -> LoadedRun:
    """Load a run (folder or file, module docstring); ReportInputError on failure, and for a baseline file, whose
    reading as a run would skip every check of its manifest and code."""
    path = Path(path)
    if path.is_dir():
        _complete_manifest_of(path)
        report = path / REPORT_FILES["json"]
        if not report.is_file():
            raise ReportInputError(f"{path}: the run finished but its {report.name} is missing; rerun it")
        run = _load_report(report)
    elif not path.is_file():
        raise ReportInputError(f"{path}: no such file or folder")
    elif is_baseline_file(path):
        raise ReportInputError(
            f"{path} is a baseline file, not a run: pass the run's folder (the --out of `mhc-parity run`) "
            f"or its {REPORT_FILES['json']}"
        )
    elif path.suffix.lower() == ".json":
        run = _load_report(path)
    else:
        run = _load_rows_file(path)
    if require_current_code:
        check_current_code(run)
    return run


def load_baseline_or_run(
    path: str | Path, *, allow_legacy: bool = False, legacy_option: str = LEGACY_OPTION
) -> LoadedRun:
    """What a gate judges against: a baseline file (legacy only with `allow_legacy`, else refused naming
    `legacy_option`) or a finished run. ReportInputError on failure."""
    path = Path(path)
    if not is_baseline_file(path):
        return load_run(path)
    return baseline_as_run(load_baseline(path, allow_legacy=allow_legacy, legacy_option=legacy_option))


def baseline_as_run(baseline: Baseline) -> LoadedRun:
    """A loaded baseline as the `LoadedRun` a gate judges against."""
    return LoadedRun(
        baseline.frame,
        baseline.path,
        baseline.policy_hash,
        dict(baseline.environment),
        True,
        implementation=baseline.implementation,
        note=baseline.note,
        recorded_selection=baseline.selection,
    )
