"""`python -m harness baseline`: a finished run written as a baseline CSV.

    baseline --from RUN --to PATH             the run's rows (`reports.commands.baseline_main`)
    baseline --from RUN --impl NAME [--to P]  only implementation NAME's rows, keyed by its name
    baseline --impl MODULE:FACTORY [--suite S] [--cases GLOB...] [--dtype D] [--case-file F]
             [--out DIR] [--to PATH]          run the implementation first (`harness.api.run_parity`,
                                              paths reference/* and <name>/*), into --out, then
                                              write its baseline (default baselines/<name>.csv)

Exit codes: 0 written; 2 a usage or configuration error, one line on stderr. Only the
third form loads JAX.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from reports.commands import BASELINE_PROG, DEFAULT_RUN_FOLDER, EXIT_USAGE, baseline_main


def run_baseline_parser() -> argparse.ArgumentParser:
    """The arguments of `baseline --impl MODULE:FACTORY` without --from (a run first)."""
    p = argparse.ArgumentParser(prog=BASELINE_PROG,
                                description="Run an external implementation and write its baseline.")
    p.add_argument("--impl", required=True, metavar="MODULE:FACTORY", help="the implementation to run")
    p.add_argument("--suite", default=None, help="case suite (default: 'default' unless --cases is given)")
    p.add_argument("--cases", nargs="+", default=None, metavar="GLOB", help="case-name globs")
    p.add_argument("--dtype", default=None, help="activation dtype filter: float32|bfloat16 (f32, bf16)")
    p.add_argument("--case-file", action="append", default=[], type=pathlib.Path, help="TOML file of extra cases")
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_RUN_FOLDER, help="run folder to write")
    p.add_argument("--to", type=pathlib.Path, default=None, help="baseline CSV (default baselines/<name>.csv)")
    return p


def _given(argv: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in argv)


def main(argv: Sequence[str]) -> int:
    """`baseline` with `argv` (the arguments after the command name); the exit code."""
    argv = list(argv)
    if _given(argv, "--from") or not _given(argv, "--impl") or _given(argv, "--help") or _given(argv, "-h"):
        return baseline_main(argv)
    try:
        args = run_baseline_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    from harness.api import ParityError, run_parity  # loads JAX: only this form runs anything

    try:
        run = run_parity(args.impl, suite=args.suite, cases=args.cases, dtype=args.dtype,
                         case_files=args.case_file, out=args.out)
    except ParityError as exc:
        print(f"{BASELINE_PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"parity: {run.verdict} ({len(run.records)} rows); run folder {args.out}")
    forwarded = ["--from", str(args.out), "--impl", run.implementations[0]]
    return baseline_main(forwarded + (["--to", str(args.to)] if args.to else []))
