"""`mhc-parity render`: every report format written again from a finished run's rows, into a copy of the run
folder (manifest and row stream too). Exit 0 or 2; loads no JAX."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from mhc_parity.harness.commands.common import EXIT_OK, Parser, error, parse
from mhc_parity.records.manifest import foreign_folder_problem
from mhc_parity.records.outputs import OutputPathError, WriterLock, writable_folder
from mhc_parity.records.rows import ReportInputError, frame_to_json_records
from mhc_parity.reports.gate.baseline_file import LEGACY_OPTION
from mhc_parity.reports.sources import load_baseline_or_run, load_run
from mhc_parity.reports.writers import write_run_folder

RENDER_PROG = "mhc-parity render"


def _render_metadata(path: str | None, own: dict) -> dict:
    if not path:
        return own
    try:
        metadata = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportInputError(f"--metadata {path}: not a readable JSON file ({exc})") from None
    if not isinstance(metadata, dict):
        raise ReportInputError(f"--metadata {path}: expected a JSON object, got a {type(metadata).__name__}")
    return metadata


def main(argv: Sequence[str] | None = None, *, prog: str = RENDER_PROG) -> int:
    """`render --rows RUN --out DIR [--metadata META.json] [--baseline B]`; exit 0 or 2. RUN is a run, never
    a baseline file."""
    parser = Parser(prog=prog, description="Write every report format again from a finished run.")
    parser.add_argument(
        "--rows", required=True, help="run folder or report.json (or rows.jsonl/rows.csv beside its manifest)"
    )
    parser.add_argument("--out", required=True, help="folder to write the reports into")
    parser.add_argument("--metadata", help="JSON file with run metadata (default: the run's own, if any)")
    parser.add_argument("--baseline", help="baseline to compute drift against")
    parser.add_argument(LEGACY_OPTION, action="store_true", help="read a --baseline in a legacy format (1 or 2)")
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        run = load_run(args.rows)
        baseline = None
        if args.baseline:
            baseline = load_baseline_or_run(args.baseline, allow_legacy=args.allow_legacy_baseline)
        metadata = _render_metadata(args.metadata, run.metadata)
        out = writable_folder(args.out)
        if out.resolve() == run.source.resolve().parent:
            raise OutputPathError(f"{out} holds the run being rendered; render into another folder")
        problem = foreign_folder_problem(out)  # files but no run manifest: a render would replace them
        if problem:
            raise OutputPathError(problem)
        with WriterLock(out, f"render ({run.source})"):  # one writer per run folder
            records = frame_to_json_records(run.frame)
            paths = write_run_folder(out, records, metadata, run.manifest, baseline=baseline)
    except (ReportInputError, OutputPathError, OSError) as exc:
        return error(str(exc))
    print(paths["html"])
    return EXIT_OK
