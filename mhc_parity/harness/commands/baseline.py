"""`mhc-parity baseline`: a finished run written as a baseline CSV.

    baseline --from RUN --to PATH             the run's rows
    baseline --from RUN --impl NAME [--to P]  only implementation NAME's rows, keyed by its name
    baseline --impl MODULE:FACTORY [run options] [--to PATH]
                                              `mhc-parity run` of it first (reference/* and <name>/*,
                                              no lowering rows), then its baseline

RUN is a whole complete run; PATH is never a run folder's own file, another suite's baseline nor, without
--allow-narrower, one covering what RUN lacks. Exit 0 written; 2 a usage error; 128 + a signal's number.
Only the third form loads JAX.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shlex
import sys
from collections.abc import Sequence

from mhc_parity.harness.commands.common import (
    DEFAULT_RUN_FOLDER,
    EXIT_FAILED,
    EXIT_OK,
    Parser,
    error,
    parse,
    warning,
)
from mhc_parity.records.outputs import OutputPathError, cannot_write, writable_file
from mhc_parity.records.path_names import implementation_glob
from mhc_parity.records.rows import ReportInputError
from mhc_parity.records.run_suite import run_suite
from mhc_parity.reports.gate.baseline_file import run_folder_refusal, write_baseline
from mhc_parity.reports.gate.comparability import (
    ALLOW_NARROWER,
    default_baseline_path,
    implementation_rows,
    narrowing_refusal,
    overwrite_refusal,
    resolve_implementation,
    selection_of_run,
)
from mhc_parity.reports.sources import load_run

BASELINE_PROG = "mhc-parity baseline"
# Options of the form that runs the implementation first (no --from), with their defaults.
RUN_OPTIONS = {
    "suite": None,
    "cases": None,
    "dtype": None,
    "case_file": [],
    "out": None,
    "resume": False,
    "quiet": False,
}


def baseline_parser(prog: str = BASELINE_PROG) -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        description="Write a finished parity run as the baseline CSV; without --from, run --impl first.",
    )
    p.add_argument(
        "--from",
        dest="source",
        type=pathlib.Path,
        default=None,
        help=f"folder or report.json of a finished run (default: {DEFAULT_RUN_FOLDER}, unless --impl runs)",
    )
    p.add_argument(
        "--to",
        dest="target",
        type=pathlib.Path,
        default=None,
        help="baseline CSV to write (required without --impl; with it default baselines/<name>.csv)",
    )
    p.add_argument(
        "--impl",
        default=None,
        metavar="NAME|MODULE:FACTORY",
        help="keep only this external implementation's rows, keyed by its name; without --from, run it first",
    )
    p.add_argument(
        "--allow-code-change",
        action="store_true",
        help="with --from: use the run even if this checkout's code changed since it was made",
    )
    p.add_argument(
        ALLOW_NARROWER,
        action="store_true",
        help="replace a baseline that covers cases, paths or implementations the new rows lack "
        "(refused without it: the gate would stop judging them)",
    )
    run = p.add_argument_group("running the implementation first (--impl MODULE:FACTORY without --from)")
    run.add_argument("--suite", default=None, help="case suite (default: 'default' unless --cases is given)")
    run.add_argument("--cases", nargs="+", default=None, metavar="GLOB", help="case-name globs")
    run.add_argument("--dtype", default=None, help="activation dtype filter: float32|bfloat16 (f32, bf16)")
    run.add_argument("--case-file", action="append", default=[], type=pathlib.Path, help="TOML file of extra cases")
    run.add_argument(
        "--out", type=pathlib.Path, default=None, help=f"run folder to write (default {DEFAULT_RUN_FOLDER})"
    )
    run.add_argument("--resume", action="store_true", help="finish an interrupted run in --out first")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def run_arguments(args, name: str) -> list[str]:
    out = args.out or DEFAULT_RUN_FOLDER
    paths = ["reference/*", implementation_glob(name)]
    argv = ["--impl", args.impl, "--paths", *paths, "--no-lowering", "--out", str(out)]
    for option, value in (("--suite", args.suite), ("--dtype", args.dtype)):
        if value is not None:
            argv += [option, value]
    if args.cases is not None:
        argv += ["--cases", *args.cases]
    for case_file in args.case_file:
        argv += ["--case-file", str(case_file)]
    return argv + ["--resume"] * args.resume + ["--quiet"] * args.quiet


def _usage_error(message: str) -> int:
    return error(message)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(baseline_parser(), argv)
    if isinstance(args, int):
        return args
    if args.source is None and args.impl is not None:
        if args.allow_code_change:
            return _usage_error("--allow-code-change applies to --from RUN only")
        return _run_then_write(args, argv)
    given = [f"--{name.replace('_', '-')}" for name, default in RUN_OPTIONS.items() if getattr(args, name) != default]
    if given:
        return _usage_error(f"{', '.join(given)} only apply when baseline runs --impl first (without --from)")
    return write_from_run(
        args.source or DEFAULT_RUN_FOLDER, args.target, args.impl, args.allow_code_change, args.allow_narrower
    )


def _run_then_write(args, argv: list[str]) -> int:
    from mhc_parity.harness.commands import run as run_command  # loads JAX: only this form runs anything
    from mhc_parity.harness.engine.implementations import ImplementationError, load_externals

    try:
        names = [impl.name for impl in load_externals([args.impl])]
    except ImplementationError as exc:
        return _usage_error(str(exc))
    if len(names) != 1:
        return _usage_error(
            f"{args.impl} gives {len(names)} implementations ({', '.join(names)}); "
            f"run them with `mhc-parity run` and write each with `baseline --from RUN --impl NAME`"
        )
    code = run_command.main(run_arguments(args, names[0]), command_line="mhc-parity baseline " + shlex.join(argv))
    if code not in (EXIT_OK, EXIT_FAILED):  # a usage error, or stopped: the run said why
        return code
    return write_from_run(
        args.out or DEFAULT_RUN_FOLDER,
        args.target,
        names[0],
        allow_code_change=False,
        allow_narrower=args.allow_narrower,
    )


def write_from_run(
    source: pathlib.Path,
    target: pathlib.Path | None,
    impl: str | None,
    allow_code_change: bool,
    allow_narrower: bool = False,
) -> int:
    """Write the finished run `source` as the baseline CSV `target` (with `impl`, only its rows, by default
    to baselines/<name>.csv). Exit 2 for every refusal of the module docstring and a run that cannot be used
    (unreadable, unfinished, a shard, empty, lacking the implementation, or unless `allow_code_change` made
    by other code); fail/error rows are written with a warning."""
    if target is None and impl is None:
        return _usage_error("give --to PATH (or --impl NAME for an implementation's baseline)")
    try:
        run = load_run(source, require_current_code=not allow_code_change)
        frame, name = run.frame, None
        if impl is not None:
            name = resolve_implementation(run, impl)
            frame = implementation_rows(run.frame, name)
        target = writable_file(target or default_baseline_path(name))
        suite = run_suite(run.manifest.request if run.manifest else None)
        selection = selection_of_run(dataclasses.replace(run, frame=frame))
        if name is not None:
            selection = dataclasses.replace(selection, implementations=(name,))
        refusal = shard_refusal(run) or run_folder_refusal(target) or overwrite_refusal(target, suite, frame["case"])
        if not refusal and not allow_narrower:
            refusal = narrowing_refusal(target, selection)
        if refusal:
            raise ReportInputError(refusal)
    except (ReportInputError, OutputPathError, ValueError) as exc:
        return _usage_error(str(exc))
    if not len(frame):
        return _usage_error(
            f"{run.source} has no rows{f' of {name!r}' if name else ''}; refusing to write an empty baseline"
        )
    try:
        path = write_baseline(
            dataclasses.replace(run, frame=frame), target, implementation=name, suite=suite, selection=selection
        )
    except ReportInputError as exc:  # rows a baseline cannot hold, e.g. two with one row key
        return _usage_error(f"{run.source}: {exc}")
    except OSError as exc:
        return _usage_error(cannot_write(exc, target))
    failing = frame["verdict"].isin(("fail", "error")).sum()
    if failing:
        warning(f"{failing} rows are fail/error; the gate fails on them")
    owner = f" of implementation {name!r}" if name else ""
    print(f"baseline written: {path} ({len(frame)} rows{owner})")
    return EXIT_OK


def shard_refusal(run) -> str:
    """Why `run` cannot be a baseline as one shard of a run, or "": a baseline of its rows would let a
    regression in the other shards' cases pass the gate unseen."""
    manifest = run.manifest
    if manifest is None or not manifest.shard:
        return ""
    count = manifest.shard.partition("/")[2]
    return (
        f"{run.source} is shard {manifest.shard} of a run ({len(manifest.cases)} of its {len(manifest.shard_of)} "
        f"cases); merge the shards first: mhc-parity merge OUT SHARD_1 ... SHARD_{count}, "
        f"then baseline --from OUT"
    )
