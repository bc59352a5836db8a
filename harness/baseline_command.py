"""`python -m harness baseline`: a finished run written as a baseline CSV.

    baseline --from RUN --to PATH             the run's rows (`reports.commands.baseline_main`)
    baseline --from RUN --impl NAME [--to P]  only implementation NAME's rows, keyed by its name
    baseline --impl MODULE:FACTORY [--suite S] [--cases GLOB...] [--dtype D] [--case-file F]
             [--out DIR] [--to PATH] [--resume] [--quiet]
                                              run the implementation first (as `harness run`
                                              with paths reference/* and <name>/*, without
                                              lowering rows), into --out, then write its
                                              baseline (default baselines/<name>.csv)

The third form is `harness run` underneath: rows stream into --out case by case, Ctrl-C or
SIGTERM stop it with a hint, and `--resume` finishes an interrupted run.

Exit codes: 0 written; 2 a usage or configuration error, one line on stderr; 128 + the
signal's number when stopped by one. Only the third form loads JAX.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys
from collections.abc import Sequence

from reports.commands import BASELINE_PROG, DEFAULT_RUN_FOLDER, EXIT_FAILED, EXIT_OK, EXIT_USAGE, baseline_main


def run_baseline_parser() -> argparse.ArgumentParser:
    """The arguments of `baseline --impl MODULE:FACTORY` without --from (a run first)."""
    p = argparse.ArgumentParser(
        prog=BASELINE_PROG, description="Run an external implementation and write its baseline."
    )
    p.add_argument("--impl", required=True, metavar="MODULE:FACTORY", help="the implementation to run")
    p.add_argument("--suite", default=None, help="case suite (default: 'default' unless --cases is given)")
    p.add_argument("--cases", nargs="+", default=None, metavar="GLOB", help="case-name globs")
    p.add_argument("--dtype", default=None, help="activation dtype filter: float32|bfloat16 (f32, bf16)")
    p.add_argument("--case-file", action="append", default=[], type=pathlib.Path, help="TOML file of extra cases")
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_RUN_FOLDER, help="run folder to write")
    p.add_argument("--to", type=pathlib.Path, default=None, help="baseline CSV (default baselines/<name>.csv)")
    p.add_argument("--resume", action="store_true", help="finish an interrupted run in --out first")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def run_arguments(args, name: str) -> list[str]:
    """The `harness run` arguments that make the run of `args` for implementation `name`."""
    argv = ["--impl", args.impl, "--paths", "reference/*", f"{name}/*", "--no-lowering", "--out", str(args.out)]
    for option, value in (("--suite", args.suite), ("--dtype", args.dtype)):
        if value is not None:
            argv += [option, value]
    if args.cases is not None:
        argv += ["--cases", *args.cases]
    for case_file in args.case_file:
        argv += ["--case-file", str(case_file)]
    return argv + ["--resume"] * args.resume + ["--quiet"] * args.quiet


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
    from harness import run_command  # loads JAX: only this form runs anything

    try:
        names = [impl.name for impl in run_command.load_externals([args.impl])]
    except run_command.ImplementationError as exc:
        print(f"{BASELINE_PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if len(names) != 1:
        print(
            f"{BASELINE_PROG}: error: {args.impl} gives {len(names)} implementations ({', '.join(names)}); "
            f"run them with `harness run` and write each with `baseline --from RUN --impl NAME`",
            file=sys.stderr,
        )
        return EXIT_USAGE
    code = run_command.main(
        run_arguments(args, names[0]), command_line="python -m harness baseline " + shlex.join(argv)
    )
    if code not in (EXIT_OK, EXIT_FAILED):  # a usage error, or stopped: the run said why
        return code
    forwarded = ["--from", str(args.out), "--impl", names[0]]
    return baseline_main(forwarded + (["--to", str(args.to)] if args.to else []))
