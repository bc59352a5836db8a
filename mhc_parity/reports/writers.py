"""`write_all`: every report format for one run, into one folder.

Files written (names fixed so CI and the runner can find them):

    rows.csv      one line per (case, candidate, partner, leaf), columns = ROW_COLUMNS
                  in schema order; floats at full precision (round-trip exact), NaN and
                  infinities as nan/inf/-inf (`mhc_parity.records.rows.encode_float`, as in every
                  file the harness writes). `mhc_parity.reports.load_rows` reads it back with exact
                  types; plain `pandas.read_csv` works too.
    report.json   {"format": "mhc-parity-report", "format_version": 1,
                   "schema_columns": [...], "metadata": {...}, "summary": {...},
                   "gate": {...} (only with a baseline: its verdict, or why the gate
                   refuses it), "rows": [...]}.
                  Strict JSON: NaN and infinities are the strings "nan", "inf", "-inf".
    report.html   the self-contained report (`mhc_parity.reports.html`).
    summary.md    the short Markdown summary (`mhc_parity.reports.markdown`).
    speed.csv     a line per (case, program) that was timed: its device time, bytes moved,
                  bandwidth and fraction of the chip's peak (`mhc_parity.reports.program_speed`).

The HTML and Markdown reports show the manifest's identity (run id, state, digests);
rows.csv stays plain CSV, trusted only next to its run's manifest (`mhc_parity.reports.sources`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from mhc_parity.records.manifest import REPORT_FILES, RUNNING, Manifest, record_stop, write_manifest
from mhc_parity.records.outputs import cannot_write
from mhc_parity.records.rows import encode_float, frame_to_json_records, json_ready, to_frame, unwrap_run
from mhc_parity.records.schema import ROW_COLUMNS
from mhc_parity.records.store import RowStore, typed_case_records
from mhc_parity.reports.causes import stated_causes
from mhc_parity.reports.drift import DEFAULT_GROWTH_FACTOR, DEFAULT_NOISE_FLOOR_ULPS
from mhc_parity.reports.gate import FAILING_CATEGORIES, INFO_CATEGORIES
from mhc_parity.reports.html import render_html
from mhc_parity.reports.judgement import Judgement, as_baseline, judge, judges_own_cases, written_run
from mhc_parity.reports.markdown import render_markdown
from mhc_parity.reports.program_speed import program_speeds, write_speed_csv
from mhc_parity.reports.rerun import run_rerun_command
from mhc_parity.reports.sources import MANIFEST_KEY, REPORT_FORMAT, REPORT_FORMAT_VERSION
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
    """The gate's judgement as plain data for report.json: the baseline, the verdict (PASS,
    FAIL or REFUSED) and why it refused, how the two instruction sets differ ("" if not), and
    when it judged, its counts and findings."""
    document = {
        "baseline": judgement.baseline,
        "verdict": judgement.verdict,
        "refusal": judgement.refusal,
        "isa_note": judgement.isa_note,
    }
    result = judgement.result
    if result is None:
        return {**document, "ok": False}
    # the systematic-shift rule not applied ("" when it was): `mhc_parity.reports.gain_shift.gain_rule_note`
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
    """Groups of row dicts [(label, rows), ...] as one CSV of the schema's columns, written
    as they come (no frame is built), `label_column` (holding each group's label) first
    when given; numbers as in rows.csv."""
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
    """The names of the external implementations a run tests (its manifest's request)."""
    return [name for name, _ in manifest.request.implementations] if manifest is not None else []


def report_document(
    frame: pd.DataFrame,
    metadata: Mapping[str, Any],
    judgement: Judgement | None,
    manifest: Manifest | None = None,
    *,
    summary: dict | None = None,
) -> dict:
    """The report.json document of a canonical row frame (`mhc_parity.records.rows.to_frame`);
    `summary` is `summarize(frame)`, computed here when not given."""
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
    """report.json (strict JSON, see the module docstring) of a canonical row frame;
    `summary` as in `report_document`."""
    document = report_document(frame, metadata, judgement, manifest, summary=summary)
    path.write_text(report_json_text(document), encoding="utf-8")
    return path


def report_json_text(document: Mapping[str, Any]) -> str:
    """`document` (a `report_document`, "rows" its last key) as indented JSON with each row
    on one line: json indents only in pure Python, which was most of a report's write time,
    while its C encoder writes each row. `json.loads` of it equals the document."""
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
    """The gate's judgement of the run a report is written for (a canonical row frame, its
    metadata and manifest, to be read back from `source`) against `baseline` (see
    `mhc_parity.reports.judgement.as_baseline`): what `mhc-parity gate --baseline B --current RUN` will say
    of it, with `--only-current-cases` for a run that selected part of its suite
    (`mhc_parity.reports.judgement.judges_own_cases`) or when `only_current_cases` (`run --only-current-cases`)."""
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
    """Write rows.csv, report.json, report.html, summary.md and speed.csv into `out_dir`.

    `rows` must have exactly the schema's columns (`ReportInputError` otherwise).
    With a `baseline` (rows, a `Baseline`/`LoadedRun`, or a path `load_baseline_or_run` reads) the
    gate judges the run (`judge_frame`: the judgement `mhc-parity gate` makes), and its verdict
    heads every format, its drift and findings below; `judgement`, one made already, is
    used instead. `manifest` (the run's, finished) is embedded in report.json and named in
    the other reports. Returns {"csv", "json", "html", "markdown", "speed"} → path.
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
    """`write_all` of a canonical row frame (`mhc_parity.records.rows.to_frame`'s), read as it is:
    its rows are not coerced again, and it is summarised once for every format. Every format
    states the causes that hold across the run (`mhc_parity.reports.causes.stated_causes`)."""
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
    """`rows` of the complete run `manifest` as a run folder, as `mhc-parity run` leaves one:
    the manifest (as running, with no case recorded) first, so that a kill from there on
    leaves a folder no reader accepts; then the row stream case by case, the reports
    (`write_frame`, given `options`), and the complete manifest last. The caller holds the
    folder's `mhc_parity.records.outputs.WriterLock`. ValueError if the rows are not those the
    manifest recorded; `mhc_parity.records.rows.ReportInputError` if they do not fit the schema."""
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
