"""`python -m reports {gate,baseline,render} ...` — the reports package's own CLI.

    gate      same as `python -m harness gate` (see `reports.gate`)
    baseline  write a run as the committed baseline CSV (see `reports.baseline`)
    render    re-render every report format from a run's rows
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

USAGE = "usage: python -m reports {gate,baseline,render} [options]  (--help after a command for details)"


def render_main(argv: Sequence[str]) -> int:
    """`render --rows RUN --out DIR [--metadata META.json] [--baseline B]`; exit 0 or 2.

    A rendered folder is a copy of the run: its reports and its manifest.
    """
    from harness.manifest import write_manifest
    from harness.outputs import OutputPathError, writable_folder
    from reports.rows import ReportInputError
    from reports.sources import load_run
    from reports.writers import write_all

    parser = argparse.ArgumentParser(prog="python -m reports render", description="Render all report formats.")
    parser.add_argument("--rows", required=True, help="run folder, report.json, rows.jsonl or rows.csv")
    parser.add_argument("--out", required=True, help="folder to write the reports into")
    parser.add_argument("--metadata", help="JSON file with run metadata (default: the run's own, if any)")
    parser.add_argument("--baseline", help="baseline to compute drift against")
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        run = load_run(args.rows)
        metadata = run.metadata
        if args.metadata:
            metadata = json.loads(Path(args.metadata).read_text(encoding="utf-8"))
        out = writable_folder(args.out)
        paths = write_all(run.frame, metadata, out, baseline=args.baseline, manifest=run.manifest)
        if run.manifest is not None:
            write_manifest(out, run.manifest)
    except (ReportInputError, OutputPathError, OSError, json.JSONDecodeError) as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    print(paths["html"])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a sub-command; exit 2 with usage on an unknown one."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "gate":
        from reports.gate import main as gate_main

        return gate_main(rest, prog="python -m reports gate")
    if command == "baseline":
        from reports.baseline import main as baseline_main

        return baseline_main(rest)
    if command == "render":
        return render_main(rest)
    print(f"unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
