"""`write_all`: every report format of one run into one folder (`OUTPUT_FILES`: rows.csv, report.json, report.html,
summary.md, speed.csv; their contents: mhc_parity/reports/README.md). Non-finite numbers are written as nan/inf/-inf
(`encode_float`), as text in the CSVs and strings in the strict JSON.

Also the files of other commands: rows as CSV (`write_rows_csv`: the kill matrix's and the sweep's), and
docs/results/*.md (`write_results`): a command's figures with their provenance (date, commit, machine, command), so a
doc links to the file instead of restating a figure that drifts.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from mhc_parity.records.files import atomic_write
from mhc_parity.records.manifest import REPORT_FILES, RUNNING, Manifest, record_stop, write_manifest
from mhc_parity.records.outputs import cannot_write
from mhc_parity.records.rows import encode_float, frame_to_json_records, json_ready, to_frame, unwrap_run
from mhc_parity.records.schema import ROW_COLUMNS
from mhc_parity.records.store import RowStore, typed_case_records
from mhc_parity.reports.causes import stated_causes
from mhc_parity.reports.gate.drift import DEFAULT_GROWTH_FACTOR, DEFAULT_NOISE_FLOOR_ULPS
from mhc_parity.reports.gate.judgement import Judgement, as_baseline, judge, judges_own_cases, written_run
from mhc_parity.reports.gate.rule import FAILING_CATEGORIES, INFO_CATEGORIES
from mhc_parity.reports.html.page import render_html
from mhc_parity.reports.markdown import render_markdown
from mhc_parity.reports.rerun import run_rerun_command
from mhc_parity.reports.sources import MANIFEST_KEY, REPORT_FORMAT, REPORT_FORMAT_VERSION
from mhc_parity.reports.speed import program_speeds, write_speed_csv
from mhc_parity.reports.summary import summarize

OUTPUT_FILES = REPORT_FILES
# What the runner is expected to put in `metadata` (any other keys are kept too).
METADATA_KEYS = (
    "jax_version",
    "jaxlib_version",
    "flax_version",
    "backend",
    "device_kind",
    "device_count",
    "git_commit",
    "command_line",
    "start_time",
    "end_time",
    "policy_file",
    "policy_hash",  # also checked by the gate against a baseline's header
    "policy_is_default",  # False: the summaries say another policy judged (mhc_parity.reports.summary.policy_note)
)

RowsInput = pd.DataFrame | Iterable[Mapping[str, Any]]


def gate_summary(judgement: Judgement) -> dict:
    """The gate's judgement as report.json data: baseline, verdict, refusal, ISA note and, when it judged, its counts
    and findings."""
    document = {
        "baseline": judgement.baseline,
        "verdict": judgement.verdict,
        "refusal": judgement.refusal,
        "isa_note": judgement.isa_note,
    }
    result = judgement.result
    if result is None:
        return {**document, "ok": False}
    document["gain_note"] = result.gain_note
    findings = [
        {
            "category": f.category,
            **dict(zip(("case", "candidate", "partner", "leaf"), f.key)),
            "detail": f.detail,
            "growth": encode_float(f.growth) if isinstance(f.growth, float) else f.growth,
        }
        for category in FAILING_CATEGORIES + INFO_CATEGORIES
        for f in result.by_category(category)
    ]
    return {
        **document,
        "ok": result.ok,
        "scope": list(judgement.scope),
        "growth_factor": result.growth_factor,
        "noise_floor_ulps": result.noise_floor_ulps,
        "baseline_rows": result.baseline_rows,
        "current_rows": result.current_rows,
        "matched_rows": result.matched_rows,
        "counts": result.counts(),
        "findings": findings,
    }


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    """rows.csv: schema-ordered columns, full float precision, non-finite numbers as nan/inf/-inf."""
    frame[list(ROW_COLUMNS)].to_csv(path, index=False, lineterminator="\n", na_rep=encode_float(math.nan))
    return path


def write_rows_csv(
    path: Path, groups: Iterable[tuple[Any, Iterable[Mapping[str, Any]]]], *, label_column: str | None = None
) -> Path:
    """Groups of row dicts [(label, rows), ...] as one CSV of the schema's columns, streamed (no frame), `label_column`
    first when given; numbers as in rows.csv."""
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([label_column, *ROW_COLUMNS] if label_column else list(ROW_COLUMNS))
        for label, rows in groups:
            lead = [label] if label_column else []
            writer.writerows([*lead, *(_csv_cell(row.get(c, "")) for c in ROW_COLUMNS)] for row in rows)
    return Path(path)


def _csv_cell(value: Any) -> Any:
    return encode_float(value) if isinstance(value, float) else value


def tested_implementations(manifest: Manifest | None) -> list[str]:
    return [name for name, _ in manifest.request.implementations] if manifest is not None else []


def report_document(
    frame: pd.DataFrame,
    metadata: Mapping[str, Any],
    judgement: Judgement | None,
    manifest: Manifest | None = None,
    *,
    summary: dict | None = None,
) -> dict:
    """The report.json document of a canonical row frame; summary: `summarize(frame)` if not given."""
    document = {
        "format": REPORT_FORMAT,
        "format_version": REPORT_FORMAT_VERSION,
        "schema_columns": list(ROW_COLUMNS),
        "metadata": json_ready(dict(metadata)),
        "summary": json_ready(summarize(frame, tested_implementations(manifest)) if summary is None else summary),
    }
    if judgement is not None:
        document["gate"] = json_ready(gate_summary(judgement))
    if manifest is not None:
        document[MANIFEST_KEY] = manifest.to_json()
    document["rows"] = frame_to_json_records(frame)
    return document


def write_json(
    frame: pd.DataFrame,
    metadata: Mapping[str, Any],
    path: Path,
    judgement: Judgement | None = None,
    manifest: Manifest | None = None,
    *,
    summary: dict | None = None,
) -> Path:
    """report.json (strict JSON) of a canonical row frame."""
    document = report_document(frame, metadata, judgement, manifest, summary=summary)
    path.write_text(report_json_text(document), encoding="utf-8")
    return path


def report_json_text(document: Mapping[str, Any]) -> str:
    """`document` ("rows" its last key) as indented JSON with each row on one line: json indents only in pure Python,
    which was most of a report's write time. `json.loads` of it equals the document."""
    rows = document["rows"]
    head = json.dumps({key: value for key, value in document.items() if key != "rows"}, indent=1, allow_nan=False)
    body = ",\n  ".join(json.dumps(row, allow_nan=False) for row in rows)
    rows_text = f"[\n  {body}\n ]" if rows else "[]"
    return head.removesuffix("\n}") + f',\n "rows": {rows_text}\n}}\n'


def judge_frame(
    frame: pd.DataFrame,
    metadata: Mapping[str, Any],
    baseline: Any,
    manifest: Manifest | None,
    source: str | Path,
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
    only_current_cases: bool = False,
) -> Judgement:
    """What `mhc-parity gate --baseline B --current RUN` will say of the run a report is written for (to be read back
    from `source`): with `--only-current-cases` when asked or when the run selected part of its suite."""
    return judge(
        as_baseline(baseline),
        written_run(frame, metadata, manifest, source),
        growth_factor=growth_factor,
        noise_floor_ulps=noise_floor_ulps,
        only_current_cases=only_current_cases or judges_own_cases(manifest),
    )


def write_all(
    rows: RowsInput,
    metadata: Mapping[str, Any] | None,
    out_dir: str | Path,
    *,
    baseline: RowsInput | str | Path | None = None,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
    manifest: Manifest | None = None,
    judgement: Judgement | None = None,
) -> dict[str, Path]:
    """Write rows.csv, report.json, report.html, summary.md and speed.csv into `out_dir`; returns {"csv", "json",
    "html", "markdown", "speed"} -> path.

    `rows`: exactly the schema's columns (ReportInputError otherwise). With a `baseline` (rows, a loaded baseline or
    run, or a path) the gate's verdict heads every format (`judgement`, if given, is used instead). `manifest` (the
    finished run's) is embedded in report.json and named in the other reports.
    """
    return write_frame(
        to_frame(unwrap_run(rows)[0]),
        metadata,
        out_dir,
        baseline=baseline,
        growth_factor=growth_factor,
        noise_floor_ulps=noise_floor_ulps,
        manifest=manifest,
        judgement=judgement,
    )


def write_frame(
    frame: pd.DataFrame,
    metadata: Mapping[str, Any] | None,
    out_dir: str | Path,
    *,
    baseline: RowsInput | str | Path | None = None,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
    manifest: Manifest | None = None,
    judgement: Judgement | None = None,
) -> dict[str, Path]:
    """`write_all` of a canonical row frame, not coerced again and summarised once; every format states the causes that
    hold across the run (`stated_causes`)."""
    frame = stated_causes(frame)
    metadata = dict(metadata or {})
    if manifest is not None:
        metadata.update(manifest.naming_fields())
    out = Path(out_dir)
    paths = {kind: out / name for kind, name in OUTPUT_FILES.items()}
    if judgement is None and baseline is not None:
        judgement = judge_frame(
            frame,
            metadata,
            baseline,
            manifest,
            paths["json"],
            growth_factor=growth_factor,
            noise_floor_ulps=noise_floor_ulps,
        )
    summary = summarize(frame, tested_implementations(manifest))
    out.mkdir(parents=True, exist_ok=True)
    write_csv(frame, paths["csv"])
    write_json(frame, metadata, paths["json"], judgement, manifest, summary=summary)
    rerun = run_rerun_command(frame, manifest, judgement, out)
    html = render_html(frame, metadata, summary=summary, judgement=judgement, rerun=rerun)
    paths["html"].write_text(html, encoding="utf-8")
    markdown = render_markdown(frame, summary=summary, metadata=metadata, judgement=judgement, rerun=rerun)
    paths["markdown"].write_text(markdown, encoding="utf-8")
    write_speed_csv(program_speeds(frame, metadata), paths["speed"])
    return paths


def write_run_folder(
    out: Path, rows: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any] | None, manifest: Manifest, **options
) -> dict[str, Path]:
    """`rows` of the complete run `manifest` as a run folder: the manifest as running first (a kill from there on leaves
    a folder no reader accepts), the row stream case by case, the reports, the complete manifest last. The caller holds
    the folder's `WriterLock`. ValueError if the rows are not those recorded; ReportInputError if they do not fit the
    schema."""
    out = Path(out)
    unfinished = dataclasses.replace(manifest, state=RUNNING, finished="", rows=None, case_records=())
    write_manifest(out, unfinished)
    by_case: dict[str, list] = {case: [] for case in manifest.cases}
    for row in rows:
        by_case.setdefault(str(row["case"]), []).append(row)
    try:
        store = RowStore(out)
        store.start_fresh()
        frame = to_frame(list(rows))  # coerced once: the stream's records and every report read it
        records = typed_case_records(frame.to_dict(orient="records"), list(by_case))
        written = {
            case: store.append_case(case, case_rows, record=records[case]) for case, case_rows in by_case.items()
        }
        problem = manifest.rows_problem(written)
        if problem:
            raise ValueError(f"the rows written to {out} are not those of run {manifest.run_id}: {problem}")
        paths = write_frame(frame, metadata, out, manifest=manifest, **options)
    except (OSError, KeyboardInterrupt) as exc:  # a full disk, Ctrl-C: said in the folder if it takes it
        stopped = (
            unfinished.failed(cannot_write(exc, out))
            if isinstance(exc, OSError)
            else unfinished.interrupted(str(exc) or "SIGINT")
        )
        record_stop(out, stopped)
        raise
    write_manifest(out, manifest)  # last: the folder is now a complete run
    return paths


RESULTS_FOLDER = Path("docs/results")


def provenance_lines(command: str, metadata: Mapping[str, Any]) -> list[str]:
    """The header lines of a results file. metadata: a run's environment record (`run_metadata`); missing keys are left
    out."""
    date = metadata.get("end_time") or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    machine = (
        ", ".join(str(metadata[key]) for key in ("host_cpu", "platform") if metadata.get(key)) or "unrecorded machine"
    )
    versions = ", ".join(
        f"{name} {metadata[key]}"
        for name, key in (("jax", "jax_version"), ("jaxlib", "jaxlib_version"), ("numpy", "numpy_version"))
        if metadata.get(key)
    )
    backend = f"; backend {metadata['backend']} ({metadata.get('device_kind', '?')})" if metadata.get("backend") else ""
    return [
        f"Written by `{command}` on {date}, commit `{metadata.get('git_commit') or 'unrecorded'}`.",
        f"Machine: {machine}{backend}; {versions or 'versions unrecorded'}.",
        "Rewritten by that command; do not edit by hand.",
    ]


def write_results(path: str | Path, markdown: str, command: str, metadata: Mapping[str, Any]) -> Path:
    """Write `markdown` (starting with its `# title` line) to `path` atomically, its provenance under the title."""
    title, _, body = markdown.partition("\n")
    document = "\n".join([title, "", *provenance_lines(command, metadata), "", body.lstrip("\n")]).rstrip() + "\n"
    path = Path(path)
    atomic_write(path, document.encode("utf-8"))
    return path
